"""Facts of the model about the call graph's closures, the process environment and checkpoints:
each built from a small source text and asserted on its own (the rules that read them are
tested by their fixtures)."""

import textwrap

import libcst as cst

from ampfix.model import AmpModel
from ampfix.model.environ import TARGET
from conftest import model


def env_write(m: AmpModel):
    return next(w for w in m.environment.writes if w.key == TARGET)


# ------------------------------------------------------------------ callgraph: functions_reaching


def test_functions_reaching_own_enclosing_and_callers():
    m = model("""
        def leaf():
            def inner():
                x = 1
            inner()

        def middle():
            leaf()

        def top():
            middle()

        def other():
            pass
    """)
    x = next(a for a in m.nodes_of(cst.Assign))
    names = {f.name.value for f in m.functions_reaching(x)}
    assert names == {"inner", "leaf", "middle", "top"}


def test_functions_reaching_module_level_is_empty():
    m = model("""
        def f():
            pass
        x = f()
    """)
    x = next(a for a in m.nodes_of(cst.Assign))
    assert m.functions_reaching(x) == []


def test_functions_reaching_a_recursion_ends():
    m = model("""
        def a():
            b()
            y = 1

        def b():
            a()
    """)
    y = next(a for a in m.nodes_of(cst.Assign))
    assert sorted(f.name.value for f in m.functions_reaching(y)) == ["a", "b"]


# ------------------------------------------------------------------ environ: launches, launches_not_running


def test_launches_and_the_functions_their_children_run():
    m = model("""
        import multiprocessing
        import subprocess
        import torch.multiprocessing as mp

        def worker(rank):
            pass

        def main():
            mp.spawn(worker, nprocs=2)
            multiprocessing.Process(target=worker).start()
            multiprocessing.get_context("spawn").Pool(4)
            subprocess.run(["nvidia-smi"])
            print("no launch")
    """)
    got = [(m.code(launch.call.func), [f.name.value for f in launch.runs]) for launch in m.launches]
    assert got == [("mp.spawn", ["worker"]), ("multiprocessing.Process", ["worker"]),
                   ('multiprocessing.get_context("spawn").Pool', []), ("subprocess.run", [])]


def test_launches_not_running_a_write_in_another_method():
    m = model("""
        import os
        import torch
        import torch.multiprocessing as mp

        class Trainer:
            def init_dist(self):
                torch.cuda.is_available()
                os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"

            def worker(self, rank):
                pass

            def fit(self):
                mp.spawn(self.worker, nprocs=2)
    """)
    launches = m.launches_not_running(env_write(m).node)
    assert [m.code(launch.call.func) for launch in launches] == ["mp.spawn"]
    assert [f.name.value for f in launches[0].runs] == ["worker"]


def test_launches_not_running_none_where_the_children_run_the_write():
    m = model("""
        import os
        import torch
        import torch.multiprocessing as mp

        def worker(rank):
            setup(rank)

        def setup(rank):
            os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)

        mp.spawn(worker, nprocs=2)
    """)
    assert m.launches_not_running(env_write(m).node) == []


def test_launches_not_running_a_program_runs_nothing_of_the_file():
    m = model("""
        import os
        import subprocess

        def main():
            os.environ["CUDA_VISIBLE_DEVICES"] = "1"
            subprocess.run(["python", "train.py"])
    """)
    assert len(m.launches_not_running(env_write(m).node)) == 1


def test_launches_not_running_empty_without_launches():
    m = model("""
        import os
        os.environ["CUDA_VISIBLE_DEVICES"] = "1"
    """)
    assert m.launches_not_running(env_write(m).node) == []


# ------------------------------------------------------------------ environ: device_chosen_before


def test_device_chosen_before_with_the_same_name():
    m = model("""
        import os
        import torch

        def main(local_rank, devices):
            torch.cuda.set_device(local_rank)
            os.environ["CUDA_VISIBLE_DEVICES"] = str(devices[local_rank])
    """)
    assert m.device_chosen_before(env_write(m))


def test_device_chosen_before_not_with_another_name():
    m = model("""
        import os
        import torch

        def main(local_rank, gpu):
            torch.cuda.set_device(local_rank)
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    """)
    assert not m.device_chosen_before(env_write(m))


def test_device_chosen_before_not_on_one_path_only():
    m = model("""
        import os
        import torch

        def main(local_rank, distributed):
            if distributed:
                torch.cuda.set_device(local_rank)
            os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)
    """)
    assert not m.device_chosen_before(env_write(m))


def test_device_chosen_before_not_after_the_write():
    m = model("""
        import os
        import torch

        def main(local_rank):
            os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)
            torch.cuda.set_device(local_rank)
    """)
    assert not m.device_chosen_before(env_write(m))


# ------------------------------------------------------------------ events: runs_with_scaler


def test_runs_with_scaler_through_the_callers():
    m = model("""
        import torch

        def save(optimizer):
            torch.save({"optimizer": optimizer.state_dict()}, "resume.pt")

        def train(model, loss, optimizer):
            scaler = torch.amp.GradScaler("cuda")
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            save(optimizer)

        def export(optimizer):
            torch.save({"optimizer": optimizer.state_dict()}, "plain.pt")
    """)
    in_save, in_export = [c for c in m.calls if m.code(c.func) == "torch.save"]
    assert m.runs_with_scaler(in_save)
    assert not m.runs_with_scaler(in_export)


# ------------------------------------------------------------------ checkpoints: what leaves the scaler out


def test_saves_without_scaler():
    m = model("""
        import torch

        scaler = torch.amp.GradScaler("cuda")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "resume.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict()}, "complete.pt")
        torch.save(model.state_dict(), "weights.pt")
        torch.save({"model": model.state_dict()}, "no_optimizer.pt")
        torch.save({**extra, "optimizer": optimizer.state_dict()}, "opaque.pt")
    """)
    (save,) = m.checkpoints.saves_without_scaler()
    assert m.code(save.state.save.args[1].value) == '"resume.pt"'
    assert save.state.keys == ["model", "optimizer"] and save.scalers == ["scaler"]


def test_saves_without_scaler_none_without_a_scaler():
    m = model("""
        import torch

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "resume.pt")
    """)
    assert m.checkpoints.saves_without_scaler() == []


def test_saves_without_scaler_where_the_run_that_saves_steps_one():
    m = model("""
        import torch

        def save(optimizer):
            torch.save({"optimizer": optimizer.state_dict()}, "resume.pt")

        def train(model, loss):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cuda")
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            save(optimizer)
    """)
    (save,) = m.checkpoints.saves_without_scaler()
    assert save.scalers == []  # none reachable in `save`, but the run that saves steps one


def test_restores_without_scaler_by_function():
    m = model("""
        import torch

        class Trainer:
            def __init__(self, model):
                self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                self.scaler = torch.amp.GradScaler("cuda")

            def resume(self, path):
                ckpt = torch.load(path)
                self.model.load_state_dict(ckpt["model"])
                self.optimizer.load_state_dict(ckpt["optimizer"])

            def resume_all(self, path):
                ckpt = torch.load(path)
                self.optimizer.load_state_dict(ckpt["optimizer"])
                self._restore_amp(ckpt)

            def _restore_amp(self, ckpt):
                self.scaler.load_state_dict(ckpt["scaler"])
    """)
    restores = m.checkpoints.restores_without_scaler()
    assert [(m.code(r.call), m.function_of(r.call).name.value, r.scalers) for r in restores] == [
        ('self.optimizer.load_state_dict(ckpt["optimizer"])', "resume", ["self.scaler"])]


def _project_model(tmp_path, files, main):
    from ampfix.project import Project
    from ampfix.project.layout import clear_caches

    clear_caches()
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text), encoding="utf-8")
    path = tmp_path / main
    return AmpModel(cst.parse_module(path.read_text()), foreign=Project(tmp_path), path=str(path))


CKPT_HELPER = """
    import torch


    def load(path, model, optimizer, scaler=None):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
"""


def test_helper_restores_without_scaler(tmp_path):
    m = _project_model(tmp_path, {"pyproject.toml": "", "ckpt.py": CKPT_HELPER, "train.py": """
        import torch
        from ckpt import load


        def run(model, path):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cuda")
            load(path, model, optimizer)
            load(path, model, optimizer, scaler)
        """}, "train.py")
    got = [(m.code(r.call), r.written_in[1:]) for r in m.checkpoints.helper_restores_without_scaler()]
    assert got == [("load(path, model, optimizer)", (8, "load"))]  # the second hands it a scaler


def test_helper_restores_without_scaler_none_where_the_file_restores_one(tmp_path):
    m = _project_model(tmp_path, {"pyproject.toml": "", "ckpt.py": CKPT_HELPER, "train.py": """
        import torch
        from ckpt import load


        def run(model, path):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cuda")
            load(path, model, optimizer)
            scaler.load_state_dict(torch.load(path)["scaler"])
        """}, "train.py")
    assert len(m.checkpoints.restored_through_helpers()) == 1
    assert m.checkpoints.helper_restores_without_scaler() == []


def test_scaler_saved_alone():
    """A GradScaler's state saved to a file of its own (sockeye's `grad_scaler.pkl`), not under a
    key of a checkpoint: the first such `torch.save`; none where only a model or optimizer is."""
    m = model("""
        import torch

        class Trainer:
            def __init__(self, model, optimizer):
                self.model, self.optimizer = model, optimizer
                self.scaler = torch.amp.GradScaler("cuda")

            def save(self, folder):
                torch.save(self.optimizer.state_dict(), folder + "/optimizer.pt")
                torch.save(self.scaler.state_dict(), folder + "/grad_scaler.pt")
        """)
    found = m.checkpoints.scaler_saved_alone()
    assert found is not None and m.code(found) == 'torch.save(self.scaler.state_dict(), folder + "/grad_scaler.pt")'
    assert model("""
        import torch

        def save(model, optimizer, path):
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        """).checkpoints.scaler_saved_alone() is None


def test_saved_dicts_merged_into_a_checkpoint():
    """`{**extra}` and `ckpt.update(extra)` of a dict of the file add its entries; of a
    parameter of the saving function, what it holds is its callers' (`spread_params`); of
    anything else, the checkpoint may hold anything (`opaque`). A comprehension of numbers
    holds no object's state, whatever its keys."""
    m = model("""
        import torch

        def save(model, optimizer, metrics, extra, path):
            fields = {"optimizer": optimizer.state_dict(), **{k: float(v) for k, v in metrics.items()}}
            torch.save({"model": model.state_dict(), **fields}, path + "a")
            ckpt = {"model": model.state_dict()}
            ckpt.update(fields)
            torch.save(ckpt, path + "b")
            torch.save({"model": model.state_dict(), **extra}, path + "c")
            torch.save({"model": model.state_dict(), **load_fields()}, path + "d")
    """)
    got = [(s.keys, s.opaque, s.spread_params, len(s.optimizers)) for s in m.checkpoints.saved_states()]
    assert got == [(["model", "optimizer"], False, [], 1), (["model", "optimizer"], False, [], 1),
                   (["model"], False, ["extra"], 0), (["model"], True, [], 0)]
    assert all(s.unknown for s in m.checkpoints.saved_states()[2:])


def test_a_rebound_parameter_merged_in_is_not_its_callers():
    m = model("""
        import torch

        def save(model, extra, path):
            extra = dict(extra)
            torch.save({"model": model.state_dict(), **extra}, path)
    """)
    (state,) = m.checkpoints.saved_states()
    assert state.spread_params == [] and state.opaque


FORWARDED = {
    "pyproject.toml": "",
    "serialization.py": """
        import torch


        def save_model(model, path, additional_fields=None):
            checkpoint = {"state_dict": model.state_dict()}
            if additional_fields is not None:
                checkpoint.update(additional_fields)
            torch.save(checkpoint, path)
    """,
    "util.py": """
        from serialization import save_model


        def save_checkpoint(model, path, optimizer, epoch):
            fields = {"optimizer": optimizer.state_dict(), "epoch": epoch}
            save_model(model, path, additional_fields=fields)


        def save_weights(model, path, epoch):
            save_model(model, path, additional_fields={"epoch": epoch})
    """,
}


def test_summary_of_a_dict_handed_to_a_save_helper(tmp_path):
    """The summary says what a function hands to a save helper (`via`, `arg`) and which
    parameter a save merges in (`spread`)."""
    from ampfix.project import Project
    from ampfix.project.layout import clear_caches

    clear_caches()
    for name, text in FORWARDED.items():
        (tmp_path / name).write_text(textwrap.dedent(text), encoding="utf-8")
    project = Project(tmp_path)
    util = project.module(str(tmp_path / "util.py")).summary
    (via,) = util.functions["save_checkpoint"].saves
    assert via["via"] == '__imported__("serialization.save_model")' and via["arg"] == "additional_fields"
    assert via["keys"] == ["optimizer", "epoch"] and via["state"]["optimizer"] == "optimizer|__param__.optimizer"
    assert util.functions["save_weights"].saves == []  # (no optimizer's state: nothing a resume needs)
    (save,) = project.module(str(tmp_path / "serialization.py")).summary.functions["save_model"].saves
    assert save["spread"] == ["additional_fields"] and not save["opaque"]


def test_checkpoint_written_through_two_helpers(tmp_path):
    m = _project_model(tmp_path, {**FORWARDED, "train.py": """
        import torch
        from util import save_checkpoint


        def run(model, loader, path):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cuda")
            for epoch in range(3):
                for x in loader:
                    scaler.scale(model(x)).backward()
                    scaler.step(optimizer)
                    scaler.update()
                save_checkpoint(model, path, optimizer, epoch)
        """}, "train.py")
    (save,) = m.checkpoints.saves_without_scaler()
    assert m.code(save.state.save).startswith("save_checkpoint(")
    assert save.state.keys == ["state_dict", "optimizer", "epoch"] and save.scalers == ["scaler"]
    assert save.state.written_in[1:] == (7, "save_checkpoint")  # where it hands the dict on
