"""The ecosystem check: ampfix over a pinned list of real PyPI projects, with labelled findings.

After ruff's ecosystem check. For each pinned project (PACKAGES below) it

  1. downloads the source distribution (the wheel where PyPI has no sdist: wheels drop the
     scripts and examples) into the git-ignored bench/.cache/ and unpacks it;
  2. runs `python -m ampfix check --select ALL --no-cache --output-format json` over the tree
     (every rule, AMP901 included; `--preview` too once the CLI has it: select_args);
  3. runs `ampfix rewrite` on two scratch copies of the tree, one with the safe fixes and one
     with `--unsafe-fixes`, and checks on each: every rewritten file still compiles; a second
     rewrite changes nothing (idempotence); a fresh `check` of the rewritten tree finds as many
     findings as the rewrite said remain (the `N findings remaining.` line of its summary);
  4. compares every finding with bench/ecosystem_labels.csv
     (`package,version,path,line,code,verdict,reason`; path relative to the tree root, a
     notebook's with its cell: `nb.ipynb:cell 3`; verdict
     TRUE, FALSE or DEBATABLE; reason: one line written after reading the code) and prints the
     precision of each rule, TRUE / (TRUE + FALSE), with the DEBATABLE count beside it, the
     unlabelled findings, and the labels that match no finding any more (stale; informational).

Usage:

    python bench/ecosystem.py --jobs 2                     # everything (downloads once, then cached)
    python bench/ecosystem.py --packages timm fairseq      # a subset
    python bench/ecosystem.py --fetch-only                 # only download and unpack
    python bench/ecosystem.py --jobs 2 --write-results     # also rewrite the tables in bench/ECOSYSTEM.md
    python bench/ecosystem.py --reuse                      # compare the labels with the last run's results
    python bench/ecosystem.py --packages yolox --no-rewrite  # check and compare only, no rewrite checks

Exit status: 0 when every finding is labelled and no rule of the default selection has a FALSE
finding; 1 otherwise (and when a rewrite check fails); 2 when a package could not be fetched
or checked. A project that cannot be downloaded is skipped and named.

Everything downloaded, the scratch copies, the rewrite diffs (bench/.cache/ecosystem/diffs/,
for reviewing the fixes) and the raw results (bench/.cache/ecosystem/results.json) stay in
bench/.cache/; no third-party code is committed. This is a benchmark, not part of CI: the full
run downloads about 100 MB and takes tens of minutes on two cores.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import functools
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
import zipfile
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_check import CACHE, _cache_dest, fetch  # noqa: E402  (the wheel download helper)

LABELS = HERE / "ecosystem_labels.csv"
RESULTS_MD = HERE / "ECOSYSTEM.md"
WORK = CACHE / "ecosystem"
VERDICTS = ("TRUE", "FALSE", "DEBATABLE")
LABEL_COLUMNS = ("package", "version", "path", "line", "code", "verdict", "reason")
TIMEOUT_S = 3600  # per ampfix command


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    kind: str = "sdist"  # "sdist", or "wheel" where PyPI has no sdist
    note: str = ""

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


# The pinned list. Bump a version only together with its labels (they are keyed by version).
PACKAGES: Tuple[Package, ...] = (
    Package("timm", "1.0.31"),
    Package("accelerate", "1.15.0"),
    Package("lightning", "2.6.6"),
    Package("transformers", "5.24.0"),
    Package("diffusers", "0.42.1"),
    Package("peft", "0.21.2"),
    Package("trl", "1.16.0"),
    Package("ultralytics", "8.4.190"),
    Package("mmengine", "0.10.7"),
    Package("mmdet", "3.3.0"),
    Package("mmpretrain", "1.2.0"),
    Package("mosaicml", "0.32.1", note="Composer"),
    Package("deepspeed", "0.19.8"),
    Package("colossalai", "0.5.0"),
    Package("fairseq", "0.12.2"),
    Package("open_clip_torch", "3.3.0"),
    Package("basicsr", "1.4.2"),
    Package("yolov5", "7.0.14"),
    Package("sentence-transformers", "6.2.0"),
    Package("torchtune", "0.6.1", kind="wheel", note="no sdist on PyPI"),
    Package("nemo-toolkit", "3.0.0"),
    Package("speechbrain", "1.1.2"),
    Package("espnet", "202611"),
    Package("kornia", "0.9.0"),
    Package("nnunetv2", "2.8.1"),
    Package("monai", "1.6.1"),
    Package("pytorch-ignite", "0.5.5"),
    Package("fastai", "2.8.12"),
    Package("salesforce-lavis", "1.0.2"),
    Package("simpletransformers", "0.70.8"),
    Package("allennlp", "2.10.1"),
    Package("fairscale", "0.4.13"),
    Package("mmcv-full", "1.7.2", note="mmcv 1.x: apex and native fp16 hooks"),
    Package("yolox", "0.3.0"),
    Package("torchdistill", "1.1.5"),
    Package("trainer", "0.0.36", note="Coqui Trainer: apex and native AMP"),
    Package("farm", "0.8.0", note="apex amp"),
    Package("rfdetr", "1.11.2"),
    Package("super-gradients", "3.7.1", kind="wheel", note="no sdist on PyPI"),
    # added 2026-11-27 (eighteenth session): projects nobody here had read, checked once before
    # any change and their findings read (bench/ECOSYSTEM.md, "eighteenth session")
    Package("anomalib", "2.7.0"),
    Package("audiocraft", "1.3.0"),
    Package("audiolm-pytorch", "2.4.0"),
    Package("avalanche-lib", "0.6.0"),
    Package("dalle2-pytorch", "1.15.6"),
    Package("denoising-diffusion-pytorch", "2.3.4"),
    Package("f5-tts", "1.1.22"),
    Package("flair", "0.15.1"),
    Package("imagen-pytorch", "2.1.0"),
    Package("lightly", "1.6.0"),
    Package("litgpt", "0.5.13"),
    Package("ludwig", "0.11.0"),
    Package("mace-torch", "0.3.16"),
    Package("mmsegmentation", "1.2.2"),
    Package("nerfstudio", "1.1.5"),
    Package("poutyne", "1.19.0"),
    Package("pyannote.audio", "4.0.7"),
    Package("pykeen", "1.11.1"),
    Package("pytorch-accelerated", "0.1.61"),
    Package("pytorch-forecasting", "1.8.0"),
    Package("rl-games", "1.6.5"),
    Package("schnetpack", "2.1.1"),
    Package("skorch", "1.4.0"),
    Package("torchgeo", "0.8.1"),
    Package("tsai", "1.0.1"),
    Package("unsloth", "2026.3.4"),
    # and 17 more the same session, checked once with the session's changes in and read
    Package("coqui-tts", "0.28.0"),
    Package("d2l", "1.0.3"),
    Package("dalle-pytorch", "1.6.6"),
    Package("darts", "0.48.1"),
    Package("gluonts", "0.17.0"),
    Package("meshgpt-pytorch", "1.8.1"),
    Package("mmaction2", "1.2.0"),
    Package("mmocr", "1.0.1"),
    Package("mmpose", "1.3.2"),
    Package("musiclm-pytorch", "0.2.8"),
    Package("naturalspeech2-pytorch", "0.1.8"),
    Package("open-flamingo", "2.0.1"),
    Package("orb-models", "0.5.5"),
    Package("phenaki-pytorch", "0.5.0"),
    Package("recbole", "1.2.1"),
    Package("setfit", "1.2.0"),
    Package("video-diffusion-pytorch", "0.7.0"),
    # added 2026-11-27 (twentieth session): 19 projects nobody here had read, checked once with
    # ceed1d1 before any change, and their findings read (bench/ECOSYSTEM.md, "twentieth session")
    Package("asteroid", "0.7.0"),
    Package("axolotl", "0.19.0"),
    Package("chemprop", "2.3.1"),
    Package("demucs", "4.1.0"),
    Package("funasr", "1.4.16"),
    Package("k-diffusion", "0.1.1.post1"),
    Package("lightning-bolts", "0.7.0"),
    Package("llm-foundry", "0.22.0"),
    Package("magvit2-pytorch", "0.5.1"),
    Package("mmrotate", "0.3.4"),
    Package("muse-maskgit-pytorch", "0.3.5"),
    Package("nanotron", "0.4"),
    Package("openunmix", "1.3.0"),
    Package("pytorch-metric-learning", "2.9.0"),
    Package("sam2", "1.1.0"),
    Package("soundstorm-pytorch", "0.6.1"),
    Package("tianshou", "2.0.1"),
    Package("torchtitan", "0.3.0"),
    Package("voicebox-pytorch", "0.5.0"),
    # and 12 more the same session, checked once at 01512f4 (after the session's changes) and read
    Package("chgnet", "0.4.2"),
    Package("descript-audio-codec", "1.0.0"),
    Package("effdet", "0.4.1"),
    Package("fastNLP", "1.0.1"),
    Package("megatron-core", "0.16.1"),
    Package("mmedit", "0.16.1"),
    Package("nequip", "0.19.1"),
    Package("OpenNMT-py", "3.5.1"),
    Package("solo-learn", "1.0.2"),
    Package("stable-audio-tools", "0.0.19"),
    Package("tez", "0.7.2"),
    Package("torchbearer", "0.5.5"),
    # added 2026-11-28 (twenty-second session): 15 projects nobody here had read, checked once
    # with 308ec8f (the session's start) and with the session's code, and their findings read
    Package("modelscope", "1.40.2"),
    Package("colbert-ai", "0.2.22"),
    Package("classy-vision", "0.7.0"),
    Package("FlagEmbedding", "1.4.2"),
    Package("opacus", "1.6.0"),
    Package("torch-geometric", "2.8.1"),
    Package("neuralforecast", "3.3.0"),
    Package("x-transformers", "2.31.10"),
    Package("mmyolo", "0.6.0"),
    Package("mmagic", "1.2.0"),
    Package("fairseq2", "0.8.1", kind="wheel", note="no sdist on PyPI"),
    Package("deepchem", "2.8.0"),
    Package("pytorch-widedeep", "1.7.0"),
    Package("autogluon.multimodal", "1.6.3"),
    Package("vissl", "0.1.6", kind="wheel", note="no sdist on PyPI"),
    # the twenty-third session's projects nobody here had read
    Package("torchrl", "0.14.1", kind="wheel", note="no sdist on PyPI"),
    Package("torchtnt", "0.2.4"),
    Package("ai2-olmo", "0.6.0"),
    Package("fairchem-core", "2.24.0"),
    Package("hivemind", "1.1.12"),
    Package("llama-recipes", "0.0.5.post2"),
    Package("mmdet3d", "1.4.0"),
    Package("alphafold3-pytorch", "0.8.3"),
    Package("determined", "0.38.1", kind="wheel", note="no sdist on PyPI"),
    Package("pytorch-pfn-extras", "0.9.0"),
    Package("s3prl", "0.4.18"),
    Package("deepmd-kit", "3.2.0"),
    Package("mattersim", "1.2.3"),
    # added 2026-11-28 (twenty-fourth session): projects nobody here had read, picked for their AMP
    # training code (GradScaler, autocast, apex amp), checked once and their findings read
    Package("nnunet", "1.7.1"),
    Package("tabpfn", "9.2.0"),
    Package("thinc", "9.1.1"),
    Package("verl", "0.9.1"),
    Package("stylegan2-pytorch", "1.9.0", note="apex amp"),
    Package("lightweight-gan", "1.2.1"),
    Package("farm-haystack", "1.26.4.post0"),
    Package("unimol-tools", "0.1.6"),
    Package("scgpt", "0.2.4"),
    Package("joeynmt", "2.3.0", kind="wheel", note="no sdist on PyPI for 2.3.0"),
    Package("torch4keras", "0.3.4"),
    Package("alignn", "2026.8.11"),
    Package("cellpose", "4.2.1.1"),
    # added 2026-11-28 (twenty-fifth session): projects nobody here had read, picked for their AMP
    # training code (GradScaler, autocast, own fp16 loss scaling, apex), checked once
    Package("skrl", "2.1.1"),
    Package("neuraloperator", "2.0.0"),
    Package("nvidia-physicsnemo", "2.2.2", kind="wheel", note="no sdist on PyPI"),
    Package("laion-clap", "1.1.7"),
    Package("so-vits-svc-fork", "4.2.30"),
    Package("descript-audiotools", "0.7.2"),
    Package("whisperspeech", "0.8.9"),
    Package("transformers4rec", "23.12.0"),
    Package("cogdl", "0.6"),
    Package("pypots", "1.5"),
    Package("torch-em", "0.10.9"),
    Package("dinov2", "0.0.1.dev2", kind="wheel",
            note="no sdist on PyPI; a third party's upload of FAIR's dinov2 code"),
    Package("parlai", "1.7.2", note="own fp16 loss scaler, apex"),
    Package("carefree-learn", "0.5.0"),
    # twenty-sixth batch (2026-11-28)
    Package("sockeye", "3.1.34", note="native AMP and apex amp"),
    Package("pythae", "0.1.2"),
    Package("fastestimator", "1.7.0"),
    Package("nvidia-physicsnemo-sym", "2.4.0"),
    Package("clinicadl", "2.0.0"),
    Package("slideflow", "3.0.2", kind="wheel", note="no sdist on PyPI for 3.0.2"),
    Package("cn-clip", "1.6.0"),
    Package("flagai", "1.8.4", note="own fp16 loss scaler"),
    Package("oumi", "0.9"),
    Package("romatch", "0.1.2"),
    Package("ai2-tango", "1.3.2"),
    Package("tabicl", "2.2.0"),
    Package("protenix", "2.0.0"),
    Package("mmgen", "0.7.3", note="native AMP and apex amp"),
    Package("yolov6detect", "0.4.1", note="a packaged copy of meituan/YOLOv6"),
    # twenty-seventh batch (2026-11-28): projects nobody here had read, picked for their hand-written
    # AMP training code, checked once and their findings read
    Package("deep-daze", "0.11.1"),
    Package("jiant", "2.2.0", note="apex amp"),
    Package("torchflare", "0.2.4"),
    Package("pylocron", "0.3.0", note="Holocron"),
    Package("torch-molecule", "0.2.0"),
    Package("adversarial-robustness-toolbox", "1.20.1", note="apex amp in estimators and trainers"),
    Package("deepxde", "1.15.0"),
    Package("pufferlib", "3.0.0"),
    Package("robustness", "1.2.1.post2", note="apex amp"),
    Package("pytext-nlp", "0.3.3", note="PyText: apex amp and own fp16 optimizers"),
    Package("textbrewer", "0.2.1.post1", note="apex amp"),
    Package("simcse", "0.4", note="a transformers Trainer subclass with its own AMP loop"),
    Package("pytabkit", "1.8.0"),
    Package("carte-ai", "0.0.26"),
    Package("nnsvs", "0.1.1"),
    # known AMP bugs, at the release before their fix
    Package("pytorch-lightning", "1.4.8",
            note="gradient clipping before GradScaler.unscale_ (Lightning-AI/pytorch-lightning#9330, fixed in 1.4.9)"),
    Package("catalyst", "21.9",
            note="OptimizerCallback clips scaled gradients (catalyst-team/catalyst#1319)"),
    Package("returnn", "1.20240720.235853",
            note="gradient clipping before unscale_ (rwth-i6/returnn#1595, merged after this release)"),
    # twenty-eighth batch (2026-11-28): projects nobody here had read, picked for their hand-written
    # AMP training code
    Package("deepinv", "0.5.0"),
    Package("diffwave", "0.1.7"),
    Package("emmental", "0.1.1", note="apex amp"),
    Package("gradcache", "0.0.1"),
    Package("bagua", "0.9.2", note="native AMP and apex amp in its examples"),
    Package("fastxtend", "0.1.7", note="fastai callbacks with their own GradScaler"),
    Package("spikingjelly", "2.0.0"),
    Package("InternEvo", "0.5.2", note="own fp16 loss scaler"),
    Package("ai2-olmo-core", "3.0.0"),
    Package("kappautils", "0.0.7"),
    Package("yolov7detect", "1.0.1", note="a packaged copy of WongKinYiu/yolov7"),
    Package("bmtrain", "1.0.1", note="own fp16 loss scaler"),
    # twenty-ninth batch (2026-11-28): what a short scout found (26 candidates read, 22 dropped:
    # bench/ECOSYSTEM.md, twenty-eighth session)
    Package("fastreid", "1.4.0", note="detectron2-style AMPTrainer"),
    Package("mmrazor", "1.0.0", note="mmengine loops with autocast"),
    Package("xtuner", "0.2.0", note=".half() LLMs in its LLaVA and SFT models"),
    Package("parler-tts", "0.2.3"),
)


def _ampfix_cmd(*args: str) -> List[str]:
    return [sys.executable, "-m", "ampfix", *args]


def _cli_has(flag: str) -> bool:
    out = subprocess.run(_ampfix_cmd("check", "--help"), capture_output=True, text=True).stdout
    return flag in out


@functools.lru_cache(maxsize=None)
def select_args() -> Tuple[str, ...]:
    """Every rule, no cache. The one switch for preview rules: `--preview` is passed (so they
    are measured too) as soon as the CLI has the flag."""
    preview = ("--preview",) if _cli_has("--preview") else ()
    return ("--select", "ALL", "--no-cache", *preview)


# ----------------------------------------------------------------------------- fetching

def _pypi_file(pkg: Package) -> dict:
    """The PyPI JSON API's entry for the pinned release's sdist (or wheel)."""
    # the project's JSON (its `releases` table), not /pypi/NAME/VERSION/json, which some mirrors lack
    api = f"https://pypi.org/pypi/{pkg.name}/json"
    with urllib.request.urlopen(api, timeout=60) as r:
        data = json.load(r)
    want = "sdist" if pkg.kind == "sdist" else "bdist_wheel"
    files = [f for f in data["releases"].get(pkg.version, []) if f["packagetype"] == want and not f.get("yanked")]
    if not files:
        raise RuntimeError(f"{pkg.spec}: PyPI has no {want}")
    return dict(files[0], url=urllib.parse.urljoin(api, files[0]["url"]))  # a mirror may give relative URLs


def _unpack(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith((".zip", ".whl")):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(dest)
    else:
        with tarfile.open(archive) as tf:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(dest, filter="data")
            else:  # Python before 3.11.4
                tf.extractall(dest)


def fetch_sdist_direct(pkg: Package) -> Path:
    """The unpacked sdist, downloaded from the URL PyPI's JSON API gives (sha256 checked).

    Not `pip download --no-binary`: pip prepares the sdist's metadata, which runs its build
    backend (setup.py files that import torch fail, and build requirements could pull torch).
    The folder is the one bench_check.fetch_sdist uses, so the two share the cache."""
    dest = _cache_dest("sdist", pkg.spec)
    if dest.is_dir() and any(dest.rglob("*.py")):
        return dest
    info = _pypi_file(pkg)
    dl = CACHE / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    archive = dl / info["filename"]
    if not archive.is_file() or hashlib.sha256(archive.read_bytes()).hexdigest() != info["digests"]["sha256"]:
        with urllib.request.urlopen(info["url"], timeout=300) as r:
            data = r.read()
        if hashlib.sha256(data).hexdigest() != info["digests"]["sha256"]:
            raise RuntimeError(f"{pkg.spec}: sha256 of {info['filename']} does not match PyPI's")
        archive.write_bytes(data)
    shutil.rmtree(dest, ignore_errors=True)
    _unpack(archive, dest)
    (dest / "WHEEL_NAME").write_text(info["filename"])
    return dest


def tree_root(dest: Path) -> Path:
    """The tree the labels' paths are relative to: an sdist's one top folder, else the folder."""
    dirs = [p for p in dest.iterdir() if p.is_dir()]
    files = [p for p in dest.iterdir() if p.is_file() and p.name != "WHEEL_NAME"]
    if len(dirs) == 1 and not files and not dirs[0].name.endswith(".dist-info"):
        return dirs[0]
    return dest


def fetch_package(pkg: Package) -> Path:
    dest = fetch(pkg.spec) if pkg.kind == "wheel" else fetch_sdist_direct(pkg)
    return tree_root(dest)


def cached_tree(pkg: Package) -> Optional[Path]:
    """The tree `fetch_package` gives, when it is unpacked in the cache already (None: not yet;
    nothing is downloaded)."""
    dest = _cache_dest(pkg.kind if pkg.kind == "wheel" else "sdist", pkg.spec)
    return tree_root(dest) if dest.is_dir() and any(dest.rglob("*.py")) else None


def count_files(root: Path) -> int:
    """The files `ampfix check` would read under root (its own discovery)."""
    from ampfix.engine.discovery import discover

    files, _ = discover([str(root)], [], root)
    return len(files)


# ----------------------------------------------------------------------------- running ampfix

def _run(cmd: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(cmd, 124, exc.stdout or "", f"timed out after {TIMEOUT_S} s")


def _norm(path: str) -> str:
    return Path(os.path.normpath(path)).as_posix()


def _crash_lines(stderr: str) -> List[str]:
    """The lines of ampfix's stderr that report an error (a file it could not analyse, a traceback)."""
    lines = stderr.splitlines()
    out = [ln for ln in lines if ": error:" in ln or ln.startswith("Traceback") or "Error:" in ln[:80]]
    if any(ln.startswith("Traceback") for ln in lines):
        out.append(lines[-1])
    return out


def only_findings(entries: List[dict]) -> List[dict]:
    """The findings of a json report, which carries input errors and warnings too (`"type"`)."""
    return [d for d in entries if d.get("type", "finding") == "finding"]


def check_tree(root: Path, jobs: int) -> Tuple[List[dict], List[str], int]:
    """(findings with paths relative to root, error lines, exit status) of `ampfix check`."""
    res = _run(_ampfix_cmd("check", *select_args(), "--output-format", "json", "-j", str(jobs), "."), root)
    try:
        findings = json.loads(res.stdout or "[]")
    except json.JSONDecodeError:
        findings = []
        res.stderr += "\nerror: the JSON report could not be read: " + res.stdout[:200]
    # the json report carries input errors too (`"type": "error"`: a file not analysed); they
    # are reported from stderr (`_crash_lines`), the findings are the rest
    findings = only_findings(findings)
    for d in findings:
        d["path"] = _norm(d["path"])
    return findings, _crash_lines(res.stderr), res.returncode


_REMAINING = re.compile(r"^(\d+) findings? remaining")
_FIXED_ROW = re.compile(r"^\s+(\d+)\s+(AMP\d{3})\s")


def parse_rewrite_summary(text: str) -> Tuple[int, Dict[str, int]]:
    """(findings remaining, findings fixed per rule) from the summary `ampfix rewrite` prints
    (ampfix.frontends.cli.fix_summary): `N findings remaining.` when some are left, none when none are."""
    remaining = 0
    fixed: Dict[str, int] = {}
    for line in text.splitlines():
        m = _REMAINING.match(line)
        if m:
            remaining = int(m.group(1))
        m = _FIXED_ROW.match(line)
        if m:
            fixed[m.group(2)] = int(m.group(1))
    return remaining, fixed


def _metadata(root: Path) -> Dict[str, bytes]:
    """The project's own metadata, which `check` reads beside the code: its configuration
    (`pyproject.toml`, `setup.cfg`) and its requirements (`requirements*.txt`,
    `requirements/*.txt`: the oldest torch, a Lightning before 2.0). A scratch copy holds them
    too, so its rewrite sees the project the check saw (lightning-bolts' `requirements/base.txt`
    pins Lightning 1.x: without it the scratch rewrite applied AMP204's fix that `check` of the
    tree does not report). And the packaging metadata it reads where those declare no version
    (`ampfix/engine/requirements.py`): `PKG-INFO`, `*.egg-info/requires.txt`, a wheel's
    `*.dist-info/METADATA` (in the tree or its `src/`; a dist-info also marks a wheel's root):
    without them whisperspeech's scratch rewrite applied the AMP101 fix that `check` holds back
    for its `torch>=2` in PKG-INFO."""
    found = [root / "pyproject.toml", root / "setup.cfg", *root.glob("requirements*.txt"),
             *(root / "requirements").glob("*.txt"), root / "PKG-INFO",
             *(f for where in (root, root / "src") for pattern in ("*.egg-info/requires.txt", "*.dist-info/METADATA")
               for f in where.glob(pattern))]
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in found if p.is_file()}


def _snapshot(root: Path) -> Dict[str, bytes]:
    from ampfix.engine.discovery import PY_SUFFIXES

    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and p.name.endswith(PY_SUFFIXES)}


def _compiles(rel: str, data: bytes) -> Optional[str]:
    """None when `data` compiles, else the error. Notebooks: each code cell without magics."""
    try:
        if rel.endswith(".ipynb"):
            nb = json.loads(data)
            for i, cell in enumerate(nb.get("cells", [])):
                if cell.get("cell_type") != "code":
                    continue
                src = cell.get("source", "")
                src = "".join(src) if isinstance(src, list) else src
                if any(ln.lstrip().startswith(("%", "!")) for ln in src.splitlines()):
                    continue
                compile(src, f"{rel}[cell {i}]", "exec", dont_inherit=True)
        elif rel.endswith(".py"):
            compile(data, rel, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _diff(rel: str, old: bytes, new: bytes) -> str:
    a = old.decode("utf-8", "replace").splitlines(keepends=True)
    b = new.decode("utf-8", "replace").splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}", n=5))


def rewrite_tree(pkg: Package, root: Path, original: Dict[str, bytes], unsafe: bool, jobs: int,
                 known: Sequence[str] = ()) -> dict:
    """Rewrite a scratch copy of `root` and check the result; returns the record of it. `known`:
    the error lines of `check` on the tree (files it could not analyse): a rewrite that exits 2
    for those alone has no problem of its own."""
    mode = "unsafe" if unsafe else "safe"
    scratch = WORK / "scratch" / pkg.key / mode
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for rel, data in {**_metadata(root), **original}.items():
        p = scratch / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    flags = ["--unsafe-fixes"] if unsafe else []
    cmd = _ampfix_cmd("rewrite", *select_args(), *flags, "--output-format", "json", "-j", str(jobs), ".")
    first = _run(cmd, scratch)
    remaining, fixed = parse_rewrite_summary(first.stderr)
    try:
        left_listed = json.loads(first.stdout or "[]")
    except json.JSONDecodeError:
        left_listed = []
    # the json report carries input errors and warnings too (`"type": "error"`): not findings
    left_listed = only_findings(left_listed)
    problems: List[str] = []
    crashes = _crash_lines(first.stderr)

    def failed(proc) -> bool:
        return proc.returncode not in (0, 1) and not (
            proc.returncode == 2 and known and set(_crash_lines(proc.stderr)) <= set(known))

    if failed(first):
        problems.append(f"rewrite exited {first.returncode}: " + "; ".join(crashes or first.stderr.splitlines()[-3:]))
    if len(left_listed) != remaining:
        problems.append(f"rewrite listed {len(left_listed)} remaining findings but its summary says {remaining}")
    after = _snapshot(scratch)
    changed = sorted(rel for rel in original if after.get(rel) != original[rel])
    diffs = []
    for rel in changed:
        err = _compiles(rel, after[rel])
        if err is not None:
            before = _compiles(rel, original[rel])
            if before is None:
                problems.append(f"{rel}: does not compile after the rewrite: {err}")
        diffs.append(_diff(rel, original[rel], after[rel]))
    # idempotence: a second rewrite must change nothing
    second = _run(cmd, scratch)
    again = _snapshot(scratch)
    for rel in sorted(r for r in after if again.get(r) != after[r]):
        problems.append(f"{rel}: a second rewrite changed it again:\n" + _diff(rel, after[rel], again[rel]))
    if failed(second):
        problems.append(f"second rewrite exited {second.returncode}: " + "; ".join(_crash_lines(second.stderr)))
    # a fresh check of the rewritten tree (after the first rewrite's state, which the second kept)
    fresh, fresh_errors, _ = check_tree(scratch, jobs)
    if len(fresh) != remaining:
        by_file_rw = Counter(_norm(d["path"]) for d in left_listed)
        by_file_ck = Counter(d["path"] for d in fresh)
        files = sorted(f for f in set(by_file_rw) | set(by_file_ck) if by_file_rw[f] != by_file_ck[f])
        detail = ", ".join(f"{f} (rewrite {by_file_rw[f]}, check {by_file_ck[f]})" for f in files)
        problems.append(f"a fresh check finds {len(fresh)} findings, the rewrite said {remaining} remain: {detail}")
    diff_file = WORK / "diffs" / f"{pkg.key}.{mode}.diff"
    diff_file.parent.mkdir(parents=True, exist_ok=True)
    diff_file.write_text("".join(diffs))
    return {"mode": mode, "changed": changed, "fixed": fixed, "remaining": remaining, "fresh": len(fresh),
            "problems": problems, "errors": crashes + fresh_errors, "diff": str(diff_file)}


def run_package(pkg: Package, jobs: int, rewrite: bool = True) -> dict:
    t0 = time.perf_counter()
    try:
        root = fetch_package(pkg)
    except Exception as exc:  # skipped and named
        return {"package": pkg.name, "version": pkg.version, "skipped": f"{type(exc).__name__}: {exc}"}
    stamp = next((d / "WHEEL_NAME" for d in (root, root.parent) if (d / "WHEEL_NAME").is_file()), None)
    rec = {"package": pkg.name, "version": pkg.version, "kind": pkg.kind, "root": str(root),
           "source": stamp.read_text().strip() if stamp else "", "files": count_files(root)}
    findings, errors, rc = check_tree(root, jobs)
    rec.update(findings=findings, errors=errors, check_status=rc)
    if rewrite:
        original = _snapshot(root)
        rec["rewrites"] = [rewrite_tree(pkg, root, original, unsafe, jobs, errors) for unsafe in (False, True)]
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    return rec


# ----------------------------------------------------------------------------- labels

@dataclass(frozen=True)
class Label:
    package: str
    version: str
    path: str
    line: int
    code: str
    verdict: str
    reason: str

    @property
    def key(self) -> Tuple[str, str, str, int, str]:
        return (self.package, self.version, self.path, self.line, self.code)


def parse_labels(text: str) -> List[Label]:
    """The rows of ecosystem_labels.csv; a malformed row raises ValueError naming its line."""
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != LABEL_COLUMNS:
        raise ValueError(f"labels: expected the columns {','.join(LABEL_COLUMNS)}, got {reader.fieldnames}")
    labels, seen = [], set()
    for row in reader:
        where = f"labels line {reader.line_num}"
        if None in row:  # (DictReader's key for the fields past the header's)
            raise ValueError(f"{where}: more than {len(LABEL_COLUMNS)} columns (a quote in a quoted reason is "
                             'written twice, "", not \\")')
        verdict = (row["verdict"] or "").strip().upper()
        if verdict not in VERDICTS:
            raise ValueError(f"{where}: verdict must be one of {', '.join(VERDICTS)}, got {row['verdict']!r}")
        if not (row["reason"] or "").strip():
            raise ValueError(f"{where}: a label needs a reason")
        try:
            line = int(row["line"])
        except (TypeError, ValueError):
            raise ValueError(f"{where}: line must be a number, got {row['line']!r}") from None
        lab = Label(row["package"].strip(), row["version"].strip(), _norm(row["path"].strip()), line,
                    row["code"].strip(), verdict, row["reason"].strip())
        if lab.key in seen:
            raise ValueError(f"{where}: a second label for {lab.key}")
        seen.add(lab.key)
        labels.append(lab)
    return labels


def finding_path(d: dict) -> str:
    """The path a label names: a notebook finding's cell is part of it (`nb.ipynb:cell 3`, as
    ampfix prints it), since its line counts from the top of the cell."""
    return d["path"] if d.get("cell") is None else f"{d['path']}:cell {d['cell']}"


def finding_key(package: str, version: str, d: dict) -> Tuple[str, str, str, int, str]:
    return (package, version, finding_path(d), int(d["line"]), d["code"])


@dataclass
class Comparison:
    verdicts: Dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # code -> verdict counts
    unlabelled: List[Tuple[str, str, dict]] = field(default_factory=list)
    stale: List[Label] = field(default_factory=list)
    false_default: List[Tuple[Label, dict]] = field(default_factory=list)
    labelled: List[Tuple[Label, dict]] = field(default_factory=list)

    def precision(self, code: str) -> Optional[float]:
        c = self.verdicts[code]
        judged = c["TRUE"] + c["FALSE"]
        return c["TRUE"] / judged if judged else None

    @property
    def failed(self) -> bool:
        return bool(self.unlabelled or self.false_default)


def compare(findings: Iterable[Tuple[str, str, dict]], labels: Sequence[Label], default_codes: Iterable[str],
            packages: Optional[Iterable[Tuple[str, str]]] = None) -> Comparison:
    """Match findings (package, version, finding) with labels. A label covers every finding of
    its (package, version, path, line, code). Labels of the given packages (all, when None) that
    match no finding are stale."""
    by_key = {lab.key: lab for lab in labels}
    default = set(default_codes)
    out = Comparison()
    used = set()
    for package, version, d in findings:
        lab = by_key.get(finding_key(package, version, d))
        if lab is None:
            out.unlabelled.append((package, version, d))
            continue
        used.add(lab.key)
        out.verdicts[d["code"]][lab.verdict] += 1
        out.labelled.append((lab, d))
        if lab.verdict == "FALSE" and d["code"] in default:
            out.false_default.append((lab, d))
    scope = None if packages is None else set(packages)
    out.stale = [lab for lab in labels if lab.key not in used
                 and (scope is None or (lab.package, lab.version) in scope)]
    return out


def default_codes() -> List[str]:
    """Rules in the default selection, from `ampfix rules --output-format json`: `default_enabled`
    (AMP901 is opt-in), and not preview once the CLI has preview rules."""
    out = subprocess.run(_ampfix_cmd("rules", "--output-format", "json"), capture_output=True, text=True,
                         check=True).stdout
    return [r["code"] for r in json.loads(out) if r.get("default_enabled", True) and not r.get("preview", False)]


# ----------------------------------------------------------------------------- reporting

def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def precision_table(cmp: Comparison, codes: Iterable[str], default: Iterable[str]) -> List[str]:
    default = set(default)
    unl = Counter(d["code"] for _, _, d in cmp.unlabelled)
    rows = ["| rule | default | findings | TRUE | FALSE | DEBATABLE | unlabelled | precision |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for code in sorted(codes):
        c = cmp.verdicts[code]
        n = sum(c.values()) + unl[code]
        if not n:
            continue
        rows.append(f"| {code} | {'yes' if code in default else 'no'} | {n} | {c['TRUE']} | {c['FALSE']} | "
                    f"{c['DEBATABLE']} | {unl[code]} | {_pct(cmp.precision(code))} |")
    tot = Counter()
    for c in cmp.verdicts.values():
        tot.update(c)
    judged = tot["TRUE"] + tot["FALSE"]
    rows.append(f"| all | | {sum(tot.values()) + len(cmp.unlabelled)} | {tot['TRUE']} | {tot['FALSE']} | "
                f"{tot['DEBATABLE']} | {len(cmp.unlabelled)} | {_pct(tot['TRUE'] / judged if judged else None)} |")
    return rows


def report(records: List[dict], cmp: Comparison, default: List[str]) -> List[str]:
    """The text printed to the terminal."""
    lines = []
    for rec in records:
        if "skipped" in rec:
            lines.append(f"{rec['package']}=={rec['version']}: SKIPPED ({rec['skipped']})")
            continue
        lines.append(f"{rec['package']}=={rec['version']}: {rec['files']} files, {len(rec['findings'])} findings, "
                     f"{rec.get('seconds', '?')} s")
        for e in rec["errors"]:
            lines.append(f"  ampfix error: {e}")
        for rw in rec.get("rewrites", []):
            for p in rw["problems"]:
                lines.append(f"  rewrite ({rw['mode']}) PROBLEM: {p}")
    lines.append("")
    lines.append("Precision per rule (TRUE / (TRUE + FALSE)):")
    lines += precision_table(cmp, {d["code"] for _, _, d in cmp.unlabelled} | set(cmp.verdicts), default)
    if cmp.unlabelled:
        lines.append(f"\n{len(cmp.unlabelled)} unlabelled findings:")
        for package, version, d in cmp.unlabelled:
            lines.append(f"  {package},{version},{finding_path(d)},{d['line']},{d['code']}  ({d['message'][:90]})")
    if cmp.false_default:
        lines.append(f"\n{len(cmp.false_default)} FALSE findings of default rules:")
        for lab, d in cmp.false_default:
            lines.append(f"  {lab.package} {lab.path}:{lab.line} {lab.code}: {lab.reason}")
    if cmp.stale:
        lines.append(f"\n{len(cmp.stale)} stale labels (no finding matches them any more):")
        for lab in cmp.stale:
            lines.append(f"  {lab.package},{lab.version},{lab.path},{lab.line},{lab.code},{lab.verdict}")
    return lines


BEGIN, END = "<!-- ecosystem:generated -->", "<!-- /ecosystem:generated -->"


def markdown(records: List[dict], cmp: Comparison, default: List[str]) -> str:
    """The generated part of ECOSYSTEM.md (between the markers; the rest is written by hand)."""
    ok = [r for r in records if "skipped" not in r]
    out = [BEGIN, "", f"ampfix {_ampfix_version()}, `check {' '.join(select_args())}`; "
           f"{len(ok)} projects, {sum(r['files'] for r in ok)} files, "
           f"{sum(len(r['findings']) for r in ok)} findings.", "", "### The pinned projects", "",
           "| project | version | source | files checked | findings | note |", "|---|---|---|---:|---:|---|"]
    notes = {(p.name, p.version): p.note for p in PACKAGES}
    for r in records:
        if "skipped" in r:
            out.append(f"| {r['package']} | {r['version']} | skipped: {r['skipped']} | | | |")
            continue
        out.append(f"| {r['package']} | {r['version']} | `{r['source']}` | {r['files']} | {len(r['findings'])} | "
                   f"{notes.get((r['package'], r['version']), '')} |")
    codes = sorted({d["code"] for r in ok for d in r["findings"]})
    out += ["", "### Findings per rule and project", "",
            "| project | " + " | ".join(codes) + " | all |", "|---|" + "---:|" * (len(codes) + 1)]
    for r in ok:
        c = Counter(d["code"] for d in r["findings"])
        if c:
            out.append(f"| {r['package']} | " + " | ".join(str(c[k] or "") for k in codes) + f" | {sum(c.values())} |")
    tot = Counter(d["code"] for r in ok for d in r["findings"])
    out.append("| **all** | " + " | ".join(str(tot[k]) for k in codes) + f" | {sum(tot.values())} |")
    out += ["", "### Precision per rule", "",
            "TRUE / (TRUE + FALSE); DEBATABLE findings are counted beside, not in the precision.", ""]
    out += precision_table(cmp, set(codes) | set(cmp.verdicts), default)
    if cmp.unlabelled:
        out += ["", f"{len(cmp.unlabelled)} findings are not labelled."]
    out += ["", "### Rewrite checks", "",
            "Each tree rewritten on a scratch copy, safe fixes and (separately) `--unsafe-fixes`: every "
            "changed file compiles, a second rewrite changes nothing, a fresh `check` finds what the "
            "rewrite said remains.", "",
            "| project | mode | files changed | fixed | remaining (rewrite / fresh check) | problems |",
            "|---|---|---:|---:|---|---|"]
    all_problems = []
    for r in ok:
        for rw in r.get("rewrites", []):
            if not rw["changed"] and not rw["problems"] and not rw["remaining"]:
                continue
            out.append(f"| {r['package']} | {rw['mode']} | {len(rw['changed'])} | {sum(rw['fixed'].values())} | "
                       f"{rw['remaining']} / {rw['fresh']} | {len(rw['problems']) or 'none'} |")
            all_problems += [f"- {r['package']} ({rw['mode']}): {p.splitlines()[0]}" for p in rw["problems"]]
    out += ["", "Problems found by the rewrite checks:" if all_problems else "No rewrite check failed.", ""]
    out += all_problems + ([""] if all_problems else [])
    errors = [f"- {r['package']}: `{e}`" for r in ok for e in r["errors"]]
    errors += [f"- {r['package']} ({rw['mode']} rewrite): `{e}`" for r in ok for rw in r.get("rewrites", [])
               for e in rw["errors"]]
    out += ["ampfix errors and crashes:" if errors else "ampfix reported no error and did not crash.", ""]
    out += errors + ([""] if errors else [])
    out.append(END)
    return "\n".join(out)


TEMPLATE = """# Ecosystem check

`bench/ecosystem.py` runs ampfix over a pinned list of real projects from PyPI and compares every
finding with the labels in `bench/ecosystem_labels.csv`. See the script's docstring for how to run it.

{generated}
"""


def write_markdown(text: str, path: Path = RESULTS_MD) -> None:
    if path.is_file():
        old = path.read_text()
        if BEGIN in old and END in old:
            head, _, rest = old.partition(BEGIN)
            _, _, tail = rest.partition(END)
            path.write_text(head + text + tail)
            return
    path.write_text(TEMPLATE.format(generated=text))


def _ampfix_version() -> str:
    """ampfix's version, and the last commit that touched the engine or the rules when in a checkout."""
    version = subprocess.run(_ampfix_cmd("--version"), capture_output=True, text=True).stdout.strip().split()[-1]
    git = subprocess.run(["git", "log", "-1", "--format=%h", "--", "ampfix", "rules"], cwd=HERE.parent,
                         capture_output=True, text=True)
    commit = git.stdout.strip() if git.returncode == 0 else ""
    return f"{version} (ampfix/ and rules/ at {commit})" if commit else version


# ----------------------------------------------------------------------------- main

def _select(names: Optional[Sequence[str]]) -> List[Package]:
    if not names:
        return list(PACKAGES)
    known = {p.name.lower(): p for p in PACKAGES}
    unknown = [n for n in names if n.lower() not in known]
    if unknown:
        raise SystemExit(f"not in the pinned list: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return [known[n.lower()] for n in names]


# a file Python compiles and LibCST cannot parse (funasr 1.4.16's tab-indented methods): named,
# not analysed, and no failure of the run (ampfix/engine/analyze.py, `_unreadable_valid`)
_PARSER_LIMIT = "not analysed: Python accepts this file"


def _unexplained(errors: Sequence[str]) -> bool:
    """`check` exited 2 for something other than files its parser cannot read (or for nothing it said)."""
    return not errors or any(_PARSER_LIMIT not in e for e in errors)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packages", nargs="+", metavar="NAME", help="only these projects of the pinned list")
    ap.add_argument("--fetch-only", action="store_true", help="download and unpack, nothing else")
    ap.add_argument("--write-results", action="store_true", help="rewrite the generated part of bench/ECOSYSTEM.md")
    ap.add_argument("--jobs", type=int, default=1, help="processes in all: projects at once, ampfix workers each")
    ap.add_argument("--no-rewrite", action="store_true", help="skip the rewrite checks")
    ap.add_argument("--reuse", action="store_true",
                    help="no ampfix run: compare the labels with the last run's results.json")
    args = ap.parse_args(argv)
    pkgs = _select(args.packages)
    jobs = max(1, args.jobs)
    if args.fetch_only:
        bad = 0
        for p in pkgs:
            try:
                root = fetch_package(p)
                print(f"{p.spec}: {root} ({count_files(root)} files)")
            except Exception as exc:
                bad += 1
                print(f"{p.spec}: SKIPPED ({type(exc).__name__}: {exc})")
        return 2 if bad else 0
    results_file = WORK / "results.json"
    if args.reuse:
        if not results_file.is_file():
            raise SystemExit(f"--reuse: no results yet ({results_file}); run without --reuse first")
        saved = {(r["package"], r["version"]): r for r in json.loads(results_file.read_text())}
        records = [saved[(p.name, p.version)] for p in pkgs if (p.name, p.version) in saved]
    else:
        at_once = min(jobs, len(pkgs))
        per = max(1, jobs // at_once)
        with ThreadPoolExecutor(max_workers=at_once) as pool:
            records = list(pool.map(lambda p: run_package(p, per, rewrite=not args.no_rewrite), pkgs))
        WORK.mkdir(parents=True, exist_ok=True)
        saved = {}
        if results_file.is_file():
            saved = {(r["package"], r["version"]): r for r in json.loads(results_file.read_text())}
        saved.update({(r["package"], r["version"]): r for r in records})
        results_file.write_text(json.dumps(list(saved.values()), indent=1) + "\n")
    labels = parse_labels(LABELS.read_text()) if LABELS.is_file() else []
    default = default_codes()
    ok = [r for r in records if "skipped" not in r]
    for r in ok:  # results saved before error entries were set apart
        r["findings"] = only_findings(r["findings"])
    cmp = compare(((r["package"], r["version"], d) for r in ok for d in r["findings"]), labels, default,
                  {(r["package"], r["version"]) for r in ok})
    print("\n".join(report(records, cmp, default)))
    if args.write_results:
        write_markdown(markdown(records, cmp, default))
        print(f"\nwrote {RESULTS_MD}")
    rewrite_failed = any(rw["problems"] for r in ok for rw in r.get("rewrites", []))
    if any("skipped" in r for r in records) or any(r["check_status"] == 2 and _unexplained(r["errors"]) for r in ok):
        return 2
    return 1 if cmp.failed or rewrite_failed else 0


if __name__ == "__main__":
    sys.exit(main())
