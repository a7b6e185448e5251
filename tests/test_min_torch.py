"""The oldest supported torch, read from the project's own metadata (as ruff infers its target
version from `requires-python`): `[project] dependencies` and optional dependencies, Poetry,
setup.cfg, setup.py, requirements files, an sdist's PKG-INFO and egg-info, a wheel's dist-info;
`min-torch-version` in the configuration and `--min-torch-version` win; without any, the default. AMP101's `custom_fwd(device_type=...)`
rewrite (torch >= 2.4) is then held back for a project that declares an older torch, and
AMP101 is silent where the project admits only a torch before 2.4 (nothing it runs warns)."""

import textwrap

import pytest

from ampfix.engine.requirements import declares_lightning_before, infer_min_torch, lower_bound, requirement_bound
from ampfix.knowledge.torch_versions import DEFAULT_MIN_TORCH

from conftest import run_ampfix

CODE = textwrap.dedent('''\
    import torch


    class Identity(torch.autograd.Function):
        @staticmethod
        @torch.cuda.amp.custom_fwd
        def forward(ctx, x):
            return x

        @staticmethod
        @torch.cuda.amp.custom_bwd
        def backward(ctx, g):
            return g
    ''')


@pytest.mark.parametrize("spec,bound", [
    (">=1.13", (1, 13)), (">=1.13,<3", (1, 13)), ("==2.1.*", (2, 1)), ("==2.1.2+cu118", (2, 1)),
    ("~=2.0", (2, 0)), ("~= 2.3.1", (2, 3)), (">2.0", (2, 0)), ("^1.13", (1, 13)), ("<3", None), ("!=2.0", None),
    (">=1.12,>=2.0", (2, 0)), ("", None), ("==2", (2, 0)),
])
def test_lower_bound(spec, bound):
    assert lower_bound(spec) == bound


@pytest.mark.parametrize("text,bound", [
    ("torch>=1.13", (1, 13)), ("Torch >= 2.0 ; python_version >= '3.8'", (2, 0)), ("torch[opt-einsum]==2.2.0", (2, 2)),
    ("torch", ()), ("torch  # any", ()),
])
def test_requirement_bound(text, bound):
    assert requirement_bound(text)[0] == bound


@pytest.mark.parametrize("text", ["torchvision>=0.15", "pytorch-lightning>=2.0", "numpy", "-r base.txt",
                                  "--extra-index-url https://download.pytorch.org/whl/cu118", "# torch>=1.0"])
def test_not_torch(text):
    assert requirement_bound(text) is None


def _project(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (root / "src").mkdir(exist_ok=True)
    (root / "src" / "fn.py").write_text(CODE)
    return root / "src"


PROJECTS = {
    "pyproject": ({"pyproject.toml": """\
        [project]
        name = "demo"
        dependencies = ["numpy", "torch>=1.13,<3", "torchvision>=0.15"]
        [project.optional-dependencies]
        old = ["torch==1.12.*"]
        """}, (1, 12), "`torch==1.12.*` in pyproject.toml"),
    "poetry": ({"pyproject.toml": """\
        [tool.poetry.dependencies]
        python = "^3.9"
        torch = "^2.1"
        """}, (2, 1), "`torch^2.1` in pyproject.toml"),
    "setup.cfg": ({"setup.cfg": """\
        [options]
        install_requires =
            numpy
            torch ~= 2.3.1
        """}, (2, 3), "`torch ~= 2.3.1` in setup.cfg"),
    "setup.py": ({"setup.py": """\
        from setuptools import setup

        REQUIRED = ["torch>=2.2.0", "einops"]
        setup(name="demo", install_requires=REQUIRED, extras_require={"cpu": ["torch==2.0.*"]})
        """}, (2, 0), "`torch==2.0.*` in setup.py"),
    "requirements": ({"requirements.txt": "--extra-index-url https://download.pytorch.org/whl/cu118\n"
                                          "torch==2.1.2+cu118 ; python_version >= '3.8'\ntorchvision\n",
                      "requirements/dev.txt": "torch>=2.2\npytest\n"},
                     (2, 1), "`torch==2.1.2+cu118 ; python_version >= '3.8'` in requirements.txt"),
}


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_inferred_from_metadata(tmp_path, name):
    files, version, where = PROJECTS[name]
    src = _project(tmp_path, files)
    found = infer_min_torch(src)
    assert found is not None and (found.version, found.where) == (version, where)


def test_no_bound_no_metadata_and_repository_root(tmp_path):
    src = _project(tmp_path / "a", {"pyproject.toml": '[project]\nname = "a"\ndependencies = ["torch"]\n'})
    assert infer_min_torch(src) is None  # torch without a lower bound says nothing
    (tmp_path / "b" / ".git").mkdir(parents=True)
    (tmp_path / "requirements.txt").write_text("torch>=1.8\n")  # above the repository: not this project's
    src = _project(tmp_path / "b", {})
    assert infer_min_torch(src) is None
    bad = _project(tmp_path / "c", {"pyproject.toml": "[project\n", "setup.py": "setup(\n"})
    assert infer_min_torch(bad) is None  # broken metadata: nothing inferred, no error


def test_custom_fwd_rewrite_follows_the_declared_torch(tmp_path):
    src = _project(tmp_path, {"pyproject.toml": '[project]\nname = "demo"\ndependencies = ["torch>=2.1"]\n'})
    res = run_ampfix("check", "--no-cache", "--select", "AMP101", src)
    out = res.stdout.decode()
    assert res.returncode == 1, out
    assert "AMP101 [*]" not in out and out.count("AMP101") == 2, out
    assert "needs torch >= 2.4 and the oldest supported torch is 2.1 (`torch>=2.1` in pyproject.toml)" in out
    res = run_ampfix("rewrite", "--select", "AMP101", src)
    assert (src / "fn.py").read_text() == CODE  # nothing that breaks torch 2.1 was written
    # the configured min-torch-version wins over the metadata, and --min-torch-version over both
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\ndependencies = ["torch>=2.1"]\n'
                                             '[tool.ampfix]\nmin-torch-version = "2.4"\n')
    res = run_ampfix("check", "--no-cache", "--select", "AMP101", src)
    assert res.stdout.decode().count("AMP101 [*]") == 2, res.stdout.decode()
    res = run_ampfix("check", "--no-cache", "--select", "AMP101", "--min-torch-version", "2.0", src)
    out = res.stdout.decode()
    assert "AMP101 [*]" not in out and "the oldest supported torch is 2.0 (--min-torch-version)" in out, out
    res = run_ampfix("rewrite", "--select", "AMP101", src)
    assert res.returncode == 0 and 'custom_fwd(device_type="cuda")' in (src / "fn.py").read_text()


def test_default_without_metadata(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "fn.py").write_text(CODE)
    res = run_ampfix("check", "--no-cache", "--select", "AMP101", tmp_path / "fn.py")
    assert res.stdout.decode().count("AMP101 [*]") == 2 and DEFAULT_MIN_TORCH == (2, 4)


# ---------------------------------------------------------------------- Lightning before 2.0 (AMP204)

LIGHTNING_CALL = "from pytorch_lightning import Trainer\n\ntrainer = Trainer(precision=16)\n"


@pytest.mark.parametrize("files,where", [
    # lightning-bolts 0.7.0's pin (its four AMP204 findings were wrong: 1.x has no "16-mixed")
    ({"requirements/base.txt": "pytorch-lightning >1.7.0, <2.0.0  # strict\n", "setup.py": "setup()\n"},
     "`pytorch-lightning >1.7.0, <2.0.0  # strict` in base.txt"),
    ({"pyproject.toml": '[project]\nname = "a"\ndependencies = ["lightning>=1.9"]\n'}, "`lightning>=1.9` in pyproject.toml"),
    ({"setup.cfg": "[options]\ninstall_requires =\n    Pytorch_Lightning<=1.9.5\n"},
     "`Pytorch_Lightning<=1.9.5` in setup.cfg"),
    ({"pyproject.toml": '[tool.poetry.dependencies]\npytorch-lightning = "^1.8"\n'},
     "`pytorch-lightning^1.8` in pyproject.toml"),
    ({"setup.py": 'setup(install_requires=["pytorch_lightning<2"])\n'}, "`pytorch_lightning<2` in setup.py"),
])
def test_a_declared_lightning_before_2(tmp_path, files, where):
    src = _project(tmp_path, files)
    assert declares_lightning_before(src, (2, 0)) == where


@pytest.mark.parametrize("files", [
    {"requirements.txt": "lightning>=2.1\n"}, {"requirements.txt": "lightning\n"},  # no bound says nothing
    {"requirements.txt": "lightning<3\n"}, {"requirements.txt": "lightning-bolts>=0.7\ntorch>=1.13\n"},
    {"pyproject.toml": '[project]\nname = "a"\ndependencies = ["pytorch-lightning>=2.0,<3"]\n'},
])
def test_no_declared_lightning_before_2(tmp_path, files):
    assert declares_lightning_before(_project(tmp_path, files), (2, 0)) is None


def test_precision_alias_left_alone_where_lightning_1_is_supported(tmp_path):
    src = _project(tmp_path, {"requirements.txt": "pytorch-lightning>1.7.0,<2.0.0\n", "src/train.py": LIGHTNING_CALL})
    res = run_ampfix("check", "--no-cache", "--preview", "--select", "AMP204", src)
    assert res.returncode == 0, res.stdout.decode()
    res = run_ampfix("rewrite", "--preview", "--select", "AMP204", src)
    assert (src / "train.py").read_text() == LIGHTNING_CALL  # nothing 1.x would reject was written
    res = run_ampfix("check", "--no-cache", "--show-settings", "--output-format", "json", src)
    import json
    assert json.loads(res.stdout)["lightning-before-2"] == "`pytorch-lightning>1.7.0,<2.0.0` in requirements.txt"
    (tmp_path / "requirements.txt").write_text("lightning>=2.0\n")
    res = run_ampfix("check", "--no-cache", "--preview", "--select", "AMP204", src)
    assert res.returncode == 1 and "AMP204 [*]" in res.stdout.decode()


# ---------------------------------------------------------------------- only a torch before 2.4 (AMP101)

@pytest.mark.parametrize("spec,before", [
    ("<2.3", True), (">=2.1,<2.3", True), ("<=2.3.1", True), ("==1.9.1", True), ("==2.1.*", True),
    ("<2.4", True), ("<2.5", False), ("<=2.4", False), (">=2.1", False), ("~=2.1", False), ("==2.4.0", False),
    ("", False), ("!=2.4", False),
])
def test_only_before(spec, before):
    from ampfix.engine.requirements import only_before

    assert only_before(spec, (2, 4)) is before


@pytest.mark.parametrize("files,where", [
    # OpenNMT-py 3.5.1's pin (its AMP101 findings were labelled DEBATABLE), and allennlp 2.10.1's
    # (its sdist declares it only in its egg-info's requires.txt: see the packaging metadata below)
    ({"setup.py": 'setup(install_requires=["torch>=2.1,<2.3", "numpy"])\n'}, "`torch>=2.1,<2.3` in setup.py"),
    ({"requirements.txt": "torch>=1.10.0,<1.13.0\ntorchvision\n"}, "`torch>=1.10.0,<1.13.0` in requirements.txt"),
    ({"requirements.txt": "torch==1.9.1\n", "requirements/dev.txt": "torch<2\n"}, "`torch==1.9.1` in requirements.txt"),
])
def test_a_project_that_admits_only_torch_before_2_4(tmp_path, files, where):
    from ampfix.engine.requirements import ProjectRequirements

    assert ProjectRequirements(_project(tmp_path, files)).torch_only_before((2, 4)) == where


@pytest.mark.parametrize("files", [
    {"requirements.txt": "torch<2.3\n", "requirements/gpu.txt": "torch>=2.1\n"},  # one requirement is open
    {"requirements.txt": "torch\n"}, {"requirements.txt": "numpy\n"}, {"setup.py": "setup()\n"},
    {"pyproject.toml": '[project]\nname = "a"\ndependencies = ["torch>=2.0,<3"]\n'},
])
def test_a_project_that_admits_a_torch_from_2_4_on(tmp_path, files):
    from ampfix.engine.requirements import ProjectRequirements

    assert ProjectRequirements(_project(tmp_path, files)).torch_only_before((2, 4)) is None


def test_deprecations_left_alone_where_no_admitted_torch_warns(tmp_path):
    src = _project(tmp_path, {"setup.py": 'setup(install_requires=["torch>=2.1,<2.3"])\n', "src/fn.py": CODE})
    res = run_ampfix("check", "--no-cache", "--select", "AMP101", src)
    assert res.returncode == 0, res.stdout.decode()
    res = run_ampfix("check", "--no-cache", "--show-settings", "--output-format", "json", src)
    import json
    assert json.loads(res.stdout)["torch-before-2-4"] == "`torch>=2.1,<2.3` in setup.py"
    (tmp_path / "setup.py").write_text('setup(install_requires=["torch>=2.1"])\n')
    res = run_ampfix("check", "--no-cache", "--select", "AMP101", src)
    assert res.returncode == 1 and res.stdout.decode().count("AMP101") == 2, res.stdout.decode()


# ---------------------------------------------------------------------- packaging metadata (PKG-INFO, egg-info)

PKG_INFO = """\
Metadata-Version: 2.1
Name: demo
Version: 1.0
Requires-Dist: numpy (>=1.21)
Requires-Dist: torch (<1.13,>=1.10)
Requires-Dist: torch<2.3,>=1.11; python_version > "3"
Requires-Dist: torch (==1.8.*) ; extra == "legacy"
Provides-Extra: legacy

Install it with:

Requires-Dist: torch>=1.2
"""

# allennlp 2.10.1's sdist, shortened: the pin is in the egg-info only (its setup.py computes it)
EGG_REQUIRES = """\
torch<1.13.0,>=1.10.0
torchvision<0.14.0,>=0.8.1

[:python_version < "3.7"]
dataclasses

[dev]
torch<1.12,>=1.9
pytest
"""


def test_pkg_info_requirements(tmp_path):
    from ampfix.engine.requirements import _from_pkg_info

    (tmp_path / "PKG-INFO").write_text(PKG_INFO)
    # the parenthesised form written as the others are; the body's line (after the blank one) not read
    assert list(_from_pkg_info(tmp_path / "PKG-INFO")) == [
        "numpy>=1.21", "torch<1.13,>=1.10", 'torch<2.3,>=1.11; python_version > "3"',
        'torch==1.8.* ; extra == "legacy"']


@pytest.mark.parametrize("files,version,where", [
    ({"PKG-INFO": PKG_INFO}, (1, 8), '`torch==1.8.* ; extra == "legacy"` in PKG-INFO'),  # an extra counts
    ({"PKG-INFO": PKG_INFO.replace('Requires-Dist: torch (==1.8.*) ; extra == "legacy"\n', "")},
     (1, 10), "`torch<1.13,>=1.10` in PKG-INFO"),  # not the body's torch>=1.2
    ({"setup.py": "setup()\n", "demo.egg-info/requires.txt": EGG_REQUIRES},
     (1, 9), "`torch<1.12,>=1.9` in demo.egg-info/requires.txt"),  # under the [dev] section
    ({"pyproject.toml": '[project]\nname = "demo"\n', "src/demo.egg-info/requires.txt": "torch>=2.1\n"},
     (2, 1), "`torch>=2.1` in demo.egg-info/requires.txt"),  # a src layout's
])
def test_min_torch_from_packaging_metadata(tmp_path, files, version, where):
    found = infer_min_torch(_project(tmp_path, files))
    assert found is not None and (found.version, found.where) == (version, where)


@pytest.mark.parametrize("files,where", [
    ({"PKG-INFO": "Metadata-Version: 2.1\nName: demo\nRequires-Dist: torch (<2.3)\n\ntorch>=2.4\n"},
     "`torch<2.3` in PKG-INFO"),
    ({"PKG-INFO": "Metadata-Version: 2.1\nName: demo\n\nRequires-Dist: torch>=2.4\n",
      "setup.py": "setup()\n", "demo.egg-info/requires.txt": EGG_REQUIRES},
     "`torch<1.13.0,>=1.10.0` in demo.egg-info/requires.txt"),
])
def test_only_torch_before_2_4_from_packaging_metadata(tmp_path, files, where):
    from ampfix.engine.requirements import ProjectRequirements

    assert ProjectRequirements(_project(tmp_path, files)).torch_only_before((2, 4)) == where


def test_packaging_metadata_read_only_where_the_declared_files_say_nothing(tmp_path):
    from ampfix.engine.requirements import ProjectRequirements

    # the declared files name torch: the metadata's requirement on it is not read (only before
    # 2.4 there, not in requirements.txt)
    src = _project(tmp_path, {"PKG-INFO": "Name: demo\nRequires-Dist: torch (<2.3,>=2.0)\n",
                              "requirements.txt": "torch>=1.13\n"})
    assert ProjectRequirements(src).torch_only_before((2, 4)) is None
    assert infer_min_torch(src).where == "`torch>=1.13` in requirements.txt"
    # a developer's checkout: setup.py says torch>=2.1, an egg-info left by an older one says
    # torch>=1.8; the setup.py wins, and the egg-info still says what setup.py does not (Lightning)
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "setup.py").write_text('setup(install_requires=["torch>=2.1"])\n')
    (dev / "demo.egg-info").mkdir()
    (dev / "demo.egg-info" / "requires.txt").write_text("torch>=1.8\npytorch-lightning<2.0\n")
    assert infer_min_torch(dev).where == "`torch>=2.1` in setup.py"
    assert ProjectRequirements(dev).lightning_before((2, 0)) == "`pytorch-lightning<2.0` in demo.egg-info/requires.txt"
    (dev / "setup.py").write_text("setup(install_requires=read_requirements())\n")  # computed: the egg-info tells
    assert infer_min_torch(dev).where == "`torch>=1.8` in demo.egg-info/requires.txt"
    # a bare "torch" in setup.py (its versions computed, autogluon's shape) gives no version: the metadata tells
    (dev / "setup.py").write_text('DEPS = {"torch": ">=2.10,<2.14"}\nsetup(install_requires=[k + v for k, v in DEPS.items()])\n')
    assert infer_min_torch(dev).where == "`torch>=1.8` in demo.egg-info/requires.txt"
    # a folder with only a PKG-INFO is a project folder (the search does not go on above it)
    (tmp_path / "requirements.txt").unlink()
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "PKG-INFO").write_text("Name: inner\nRequires-Dist: torch (>=2.2)\n")
    found = infer_min_torch(tmp_path / "inner")
    assert found is not None and (found.version, found.where) == ((2, 2), "`torch>=2.2` in PKG-INFO")


def test_deprecations_left_alone_where_the_sdist_admits_only_torch_before_2_4(tmp_path):
    src = _project(tmp_path, {"setup.py": "setup()\n", "demo.egg-info/requires.txt": EGG_REQUIRES,
                              "src/fn.py": CODE})
    res = run_ampfix("check", "--no-cache", "--select", "AMP101", src)
    assert res.returncode == 0, res.stdout.decode()


# joeynmt 2.3.0's wheel, unpacked as a tree: no declared file, only the wheel's metadata (the
# PKG-INFO format: its header's Requires-Dist, then the long description, not read)
WHEEL_METADATA = """\
Metadata-Version: 2.1
Name: pkg
Version: 1.0
Requires-Dist: numpy >=1.19
Requires-Dist: torch >=1.12.0

Install it with `pip install pkg`; for the fast path: torch>=2.4
Requires-Dist: torch>=2.4
"""

GRAD_SCALER = "import torch\n\nscaler = torch.cuda.amp.GradScaler()\n"


def _wheel_tree(root, extra=None):
    """`pkg/__init__.py`, `pkg/train.py` and `pkg-1.0.dist-info/METADATA` (and `extra`) under `root`
    (a repository root); the package's folder."""
    (root / ".git").mkdir(parents=True)
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "train.py").write_text(GRAD_SCALER)
    (root / "pkg-1.0.dist-info").mkdir()
    (root / "pkg-1.0.dist-info" / "METADATA").write_text(WHEEL_METADATA)
    for name, text in (extra or {}).items():
        (root / name).write_text(text)
    return root / "pkg"


def test_min_torch_from_a_wheels_dist_info(tmp_path):
    from ampfix.engine.requirements import ProjectRequirements

    pkg = _wheel_tree(tmp_path)
    for start in (pkg, pkg / "train.py", tmp_path):
        found = infer_min_torch(start)  # the requirement as written; not the description's torch>=2.4
        assert found is not None and (found.version, found.where) == (
            (1, 12), "`torch >=1.12.0` in pkg-1.0.dist-info/METADATA"), start
    assert ProjectRequirements(pkg).torch_only_before((2, 4)) is None
    # a src layout's, as an egg-info's is read there
    (tmp_path / "src").mkdir()
    (tmp_path / "pkg-1.0.dist-info").rename(tmp_path / "src" / "pkg-1.0.dist-info")
    (tmp_path / "setup.py").write_text("setup()\n")
    found = infer_min_torch(pkg)
    assert found is not None and found.where == "`torch >=1.12.0` in pkg-1.0.dist-info/METADATA"


def test_a_folder_with_a_dist_info_is_a_project_folder(tmp_path):
    # the search stops at the wheel's tree: the requirements.txt above it are not its project's
    (tmp_path / "requirements.txt").write_text("torch>=2.2\n")
    pkg = _wheel_tree(tmp_path / "wheel")
    found = infer_min_torch(pkg)
    assert found is not None and found.version == (1, 12), found
    # a folder holding several distributions' metadata (site-packages) is an environment: the
    # search goes on above it
    env = tmp_path / "env" / "site-packages"
    for name, pin in (("a-1.0", "torch >=1.8"), ("b-2.0", "torch >=2.0")):
        (env / f"{name}.dist-info").mkdir(parents=True)
        (env / f"{name}.dist-info" / "METADATA").write_text(f"Name: x\nRequires-Dist: {pin}\n")
    (env / "mod.py").write_text("import torch\n")
    found = infer_min_torch(env / "mod.py")
    assert found is not None and found.where == "`torch>=2.2` in requirements.txt", found.where


def test_declared_files_win_over_a_dist_info(tmp_path):
    from ampfix.engine.requirements import ProjectRequirements

    pkg = _wheel_tree(tmp_path, {"setup.py": 'setup(install_requires=["torch>=2.1", "numpy"])\n'})
    found = infer_min_torch(pkg)
    assert found is not None and (found.version, found.where) == ((2, 1), "`torch>=2.1` in setup.py")
    # the dist-info still says what the declared files do not (Lightning), as an egg-info does
    (tmp_path / "pkg-1.0.dist-info" / "METADATA").write_text(
        WHEEL_METADATA.replace("Requires-Dist: numpy", "Requires-Dist: pytorch-lightning <2.0\nRequires-Dist: numpy"))
    assert ProjectRequirements(pkg).lightning_before((2, 0)) == "`pytorch-lightning <2.0` in pkg-1.0.dist-info/METADATA"
    assert infer_min_torch(pkg).where == "`torch>=2.1` in setup.py"


def test_grad_scaler_not_migrated_in_a_wheel_that_supports_torch_1_12(tmp_path):
    pkg = _wheel_tree(tmp_path)
    res = run_ampfix("check", "--no-cache", "--select", "AMP101", pkg)
    out = res.stdout.decode()
    assert res.returncode == 1 and "AMP101 [*]" not in out and out.count("AMP101") == 1, out
    assert ("not migrated automatically: its replacement needs torch >= 2.3 and the oldest supported torch is 1.12 "
            "(`torch >=1.12.0` in pkg-1.0.dist-info/METADATA)") in out, out
    res = run_ampfix("rewrite", "--select", "AMP101", pkg)
    assert (pkg / "train.py").read_text() == GRAD_SCALER, res.stdout.decode()  # nothing that breaks torch 1.12
    res = run_ampfix("check", "--no-cache", "--select", "AMP101", "--fix", pkg)
    assert (pkg / "train.py").read_text() == GRAD_SCALER, res.stdout.decode()
