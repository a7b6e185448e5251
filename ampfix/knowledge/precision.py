"""Each rule's measured precision: how often its findings were right on real projects that
nobody working on ampfix had read (the ecosystem check, `bench/ecosystem.py`; its labels,
`bench/ecosystem_labels.csv`; its results, `bench/ECOSYSTEM.md`).

A finding is labelled TRUE (a real mistake), FALSE (the code is right) or DEBATABLE; a rule's
precision is TRUE / (TRUE + FALSE). A rule whose measured precision is below `THRESHOLD` is a
preview rule: it runs only with `--preview` (or `preview = true` in `[tool.ampfix]`), until it
does better. A rule with no judged finding there is not measured: its own `preview` attribute
decides (`ampfix.rule.Rule.preview`). `ampfix explain`, `ampfix rules` and the README's rule
table state each rule's numbers.

Import-light (the warm path reads it): no LibCST, no rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

#: the default selection holds the rules measured at this precision or better
THRESHOLD = 0.95


@dataclass(frozen=True)
class Measured:
    true: int
    false: int
    debatable: int = 0
    source: str = ""  # which run: "ecosystem check of 2026-12-01 (42 projects)"

    @property
    def judged(self) -> int:
        return self.true + self.false

    @property
    def findings(self) -> int:
        return self.true + self.false + self.debatable

    @property
    def precision(self) -> Optional[float]:
        return self.true / self.judged if self.judged else None


#: code -> the rule's numbers in the last ecosystem check (rules with no finding there are absent).
#: Filled from `python bench/ecosystem.py` (its precision table), one line per rule.
MEASURED: Dict[str, Measured] = {
    "AMP001": Measured(16, 0, 6, "ecosystem check of 2026-11-28, twenty-first session (116 projects; backward inside an autocast "
                               "region labelled TRUE unless the region is there on purpose) and the twenty-fourth session's 13 projects nobody had read (157 projects, check --select ALL --preview): nnunet's two "
                               "backward calls in autocast in uncalled VRAM-probing functions, DEBATABLE; pypots' backward in "
                               "its own autocast(**kwargs) wrapper's region (twenty-fifth session) is the source of that check "
                               "(5a208bb), TRUE, not counted; the twenty-sixth batch's 15 projects nobody had read (186 projects, check --select ALL --preview): cn-clip's backward and step inside the autocast region, TRUE"),
    "AMP003": Measured(8, 2, 0, "ecosystem check of 2026-11-28, twenty-second session (131 projects: 7 TRUE) and the "
                               "twenty-third session's 13 projects nobody had read (144 projects, check --select ALL "
                               "--preview): two FALSE on torchrl's expert-iteration scripts (a conjunction test with an "
                               "else, a regression of 7f47acb), fixed since by reading them (2b5e1ee), still counted; the "
                               "twenty-fifth session's 14 projects (171 projects): cogdl's fp16 clip with no unscale_, TRUE"),
    "AMP004": Measured(4, 5, 2, "ecosystem check of 2026-11-25 (42 projects: 2/4/2, its false findings fixed since by "
                               "reading them) and of the twentieth session's 31 unseen projects (1/1/0, its false "
                               "finding, a paddle scaler, fixed since by reading it); the twenty-sixth session (201 projects): deepspeed's GradScaler stepped and updated per ZeRO sub-group, reached through a star import of a project module (bcb5b38), TRUE"),
    "AMP005": Measured(2, 2, 0, "ecosystem check of 2026-11-27, twentieth session (116 projects): its false finding, a variable set "
                               "for child processes after this process's own set_device (nequip); and the twenty-fourth session's 13 projects nobody had read (157 projects, check --select ALL --preview): unimol-tools' "
                               "CUDA_VISIBLE_DEVICES set for the workers mp.spawn starts, FALSE; both fixed since by reading them "
                               "(not a measure on unseen code)"),
    "AMP006": Measured(4, 0, 1, "ecosystem check of 2026-11-28, twenty-third session (144 projects, check --select ALL --preview: "
                               "torchrl's two scalers rebuilt per step, TRUE); earlier, its one wrong finding on 85 projects, the "
                               "resumable train() of flair, fixed since: Iterations.iterates_epochs; the twenty-sixth batch's 15 projects nobody had read (186 projects, check --select ALL --preview): protenix's per-step GradScaler that its dtype test never enables, DEBATABLE"),
    "AMP009": Measured(2, 2, 2, "ecosystem check of 2026-11-27 (85 projects, check --select ALL --preview) (its one wrong finding of 2026-11-25, allennlp's stage-guarded unscale_, fixed since: Guards.in_stage_test); the twenty-sixth batch's 15 projects nobody had read (186 projects, check --select ALL --preview): mmgen's generator steps with one update after the loop, TRUE; the twenty-eighth batch's 12 projects nobody had read (213 projects, check --select ALL --preview): spikingjelly's unscale_ after an `if not step_optimizer: raise` guard and deepinv's second unscale_ in the branch where `grad_norm is None` marks that the first did not run, 2 FALSE, fixed since by reading them (7abe649: Flow's guard and marker decisions), still counted"),
    "AMP010": Measured(0, 1, 0, "the twenty-eighth batch's 12 projects nobody had read (213 projects, check --select ALL --preview): deepinv's clip under `if not defer_clip:`, where `defer_clip` is the project's own test that the scaler is enabled and the step is not on the boundary (its unscale_ runs once per step), FALSE, not fixed (it needs a local's definition read into later tests, `is_enabled()` as the scaler's state, and a call's argument carried into the callee's tests)"),
    "AMP013": Measured(46, 2, 5, "ecosystem check of 2026-11-28, twenty-third session (144 projects; s3prl's pretrain resume "
                               "checkpoint, TRUE) and the twenty-fourth session's 13 projects nobody had read (157 projects, check --select ALL --preview): farm-haystack's save and load, torch4keras's resume, TRUE; "
                               "its false finding, a GradScaler used as a fixed loss scale and never updated (modelscope's nerf "
                               "trainer), is fixed since by reading it; flair's two TRUE findings and OpenNMT-py's one are the "
                               "sources of the checks that find them (a parameter annotated with a project class, an "
                               "optimizer wrapper's state_dict), not counted; the twenty-sixth batch's 15 projects nobody had read (186 projects, check --select ALL --preview): 9 TRUE, 2 DEBATABLE, 1 FALSE (sockeye's optimizer restored by a helper whose caller restores the scaler, fixed since by reading it: 7c5045d); the twenty-seventh batch's 15 projects nobody had read (201 projects, check --select ALL --preview): nnsvs' checkpoints and resume without the GradScaler, 9 TRUE; the twenty-eighth batch's 12 projects nobody had read (213 projects, check --select ALL --preview): 15 TRUE (spikingjelly 8, yolov7detect 4, bagua 2, deepinv 1); the twenty-eighth session: tabpfn's checkpoint written through two helpers without the GradScaler is the source of that check (4237bb4), TRUE, not counted"),
    "AMP101": Measured(502, 5, 16, "ecosystem check of 2026-11-28, twenty-third session (144 projects; silent under a pin to a torch "
                               "before 2.4, read from egg-info too) and the twenty-fourth session's 13 projects nobody had read (157 projects, check --select ALL --preview): 23 TRUE, 6 DEBATABLE (nnunet's uncalled "
                               "probing functions), 1 FALSE (torch4keras's autocast class taken as a value in a version shim); its "
                               "five false findings, a bare except: shim (megatron-core, two), a use in an except fallback "
                               "(torchtnt), an isinstance shim (pytorch-pfn-extras) and the value shim, fixed since by reading them; "
                               "the twenty-fifth session's 14 projects (171 projects): 21 TRUE, 1 DEBATABLE (laion-clap's uncalled "
                               "zero-shot evaluation); the twenty-sixth batch's 15 projects nobody had read (186 projects, check --select ALL --preview): 24 TRUE, 1 DEBATABLE (fastestimator, which pairs itself with torch 2.3.1); the twenty-seventh batch's 15 projects nobody had read (201 projects, check --select ALL --preview): 26 TRUE; and the autocast state functions torch 2.4 deprecated (133e1fa): 34 TRUE on 10 earlier projects, flagai's the source of the check, not counted; the twenty-eighth batch's 12 projects nobody had read (213 projects, check --select ALL --preview): 35 TRUE, 5 DEBATABLE (fastxtend's @delegates(GradScaler) signatures, InternEvo's DIPU-only accelerator); mmengine's get_autocast_gpu_dtype() in the modern branch of a version test is the source of that check (7276125), 2 TRUE, not counted; the twenty-ninth batch's 4 projects nobody had read (217 projects, check --select ALL --preview): 13 TRUE (xtuner 12, parler-tts 1: torch.get_autocast_gpu_dtype() in flash-attention paths)"),
    "AMP012": Measured(0, 0, 1, "ecosystem check of 2026-11-28, twenty-fifth session (171 projects, check --select ALL --preview): "
                               "skrl's gradient penalty on discriminator logits, taken unscaled under float16 autocast, "
                               "DEBATABLE (its input gradients sit far above float16's floor in a CPU repro)"),
    "AMP017": Measured(2, 0, 0, "ecosystem check of 2026-11-28, twenty-fifth session (171 projects, check --select ALL --preview): "
                               "transformers4rec's backward under float16 autocast with no GradScaler, TRUE; pypots' "
                               "backward under its own autocast(**kwargs) shim is the source of that check (579e255), "
                               "TRUE, not counted; the twenty-sixth batch's 15 projects nobody had read (186 projects, check --select ALL --preview): pythae's trainer, TRUE; the twenty-sixth session: protenix's fp16 run under a GradScaler whose enabled= test is never true is the source of that check (c638c10), TRUE, not counted"),
    "AMP102": Measured(38, 10, 75, "ecosystem check of 2026-11-28, twenty-third session (144 projects) and the twenty-fourth session's 13 projects nobody had read (157 projects, check --select ALL --preview): "
                               "stylegan2-pytorch's apex amp O1, its only mixed precision, 4 TRUE; the twenty-sixth batch's 15 projects nobody had read (186 projects, check --select ALL --preview): sockeye's and mmgen's opt-in apex backends beside their native ones, 12 DEBATABLE; the twenty-seventh batch's 15 projects nobody had read (201 projects, check --select ALL --preview): apex as the only mixed precision of jiant, ART and robustness, 23 TRUE; pytext's and simcse's opt-in apex backends, 5 DEBATABLE; ART's input-gradient scale_loss advised a scaler step, 5 FALSE, fixed since by reading them (a50ef8a), still counted; textbrewer's apex through a star import is the source of that check (bcb5b38), TRUE, not counted; the twenty-eighth batch's 12 projects nobody had read (213 projects, check --select ALL --preview): apex as the only mixed precision of bagua's examples and emmental, 6 TRUE; textbrewer's distiller_multitask.py, reached through the star import without naming apex, is the source of that trigger (1218fad), 2 TRUE, not counted"),
    "AMP103": Measured(19, 0, 8, "ecosystem check of 2026-11-28, twenty-second session (131 projects, check --select ALL --preview); the twenty-sixth batch's 15 projects nobody had read (186 projects, check --select ALL --preview): flagai's apex imports, 2 TRUE, 1 DEBATABLE (an unused LayerNorm); the twenty-seventh batch's 15 projects nobody had read (201 projects, check --select ALL --preview): nnsvs' FusedLayerNorm picked whenever apex imports, TRUE"),
    "AMP204": Measured(0, 4, 0, "ecosystem check of 2026-11-27, twentieth session (104 projects, check --select ALL --preview); "
                               "its four findings, on a project pinned to pytorch-lightning<2.0, are fixed since by reading "
                               "them (not a measure on unseen code)"),
    "AMP019": Measured(0, 1, 0, "ecosystem check of 2026-11-28, twenty-first session (116 projects, check --select ALL --preview); "
                               "its one finding on code it was not written from, espnet's overflow branch that steps and "
                               "updates in a loop over the optimizers, is fixed since by reading it (not a measure on unseen "
                               "code); funasr's two, its source, are TRUE and not counted"),
    "AMP007": Measured(0, 1, 1, "ecosystem check of 2026-11-28, twenty-second session (131 projects): modelscope's fixed loss scale "
                               "with Adam, DEBATABLE; and the twenty-fourth session's 13 projects nobody had read (157 projects, check --select ALL --preview): unimol-tools' optimizer.step() after its own "
                               "DynamicLossScaler unscaled and checked the gradients, FALSE, fixed since by reading it (3814079)"),
    "AMP202": Measured(1, 0, 0, "ecosystem check of 2026-11-27, twentieth session (116 projects, check --select ALL --preview)"),
    "AMP201": Measured(0, 1, 0, "ecosystem check of 2026-11-25 (42 projects, check --select ALL --preview); its "
                               "false finding, fixed since by reading it, is not a measure on unseen code, and the "
                               "74 projects added since gave it none"),
}


def measured(code: str) -> Optional[Measured]:
    m = MEASURED.get(code)
    return m if m is not None and m.judged else None


def below_threshold(code: str) -> bool:
    """The rule was measured, and below the threshold: it is a preview rule until it does better."""
    m = measured(code)
    return m is not None and m.precision is not None and m.precision < THRESHOLD


def note(code: str) -> str:
    """One line for the docs: "precision 0.97 on 31 findings (30 right, 1 wrong, 2 debatable; ...)"."""
    m = measured(code)
    if m is None:
        return "precision not measured yet (no finding in the ecosystem check)"
    parts = [f"{m.true} right", f"{m.false} wrong"] + ([f"{m.debatable} debatable"] if m.debatable else [])
    where = f"; {m.source}" if m.source else ""
    return f"precision {m.precision:.2f} on {m.judged} judged findings ({', '.join(parts)}{where})"


def short(code: str) -> str:
    """For tables: "0.97 (31)" or "not measured"."""
    m = measured(code)
    return "not measured" if m is None else f"{m.precision:.2f} ({m.judged})"
