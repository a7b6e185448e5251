"""Facts of the model about the call graph's closures, the process environment and checkpoints:
each built from a small source text and asserted on its own (the rules that read them are
tested by their fixtures)."""

import textwrap

import libcst as cst

from ampfix.model import AmpModel
from ampfix.model.environ import TARGET


def model(src: str) -> AmpModel:
    return AmpModel(cst.parse_module(textwrap.dedent(src)))


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
