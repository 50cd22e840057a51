import json

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import skeleton_path
from rfsgen.cli import main


@pytest.fixture
def runner():
    return CliRunner()


def run(runner, args, **kw):
    return runner.invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


def test_every_command_has_help_with_an_example(runner):
    res = run(runner, ["--help"])
    assert res.exit_code == 0
    commands = [line.split()[0] for line in res.output.split("Commands:")[1].strip().splitlines()]
    assert "skeleton" in commands and "kernel" in commands
    for cmd in commands:
        res = run(runner, [cmd, "--help"])
        assert res.exit_code == 0
        assert "Example" in res.output, cmd


def test_skeleton_describes(runner):
    res = run(runner, ["skeleton", skeleton_path("cifar-deep")])
    assert res.exit_code == 0
    assert "width 1728 (shape [24, 24, 3])" in res.output
    assert "C(S)       0.25" in res.output
    assert "conv1        conv    10x10         100        25  exp(beta=0.25)" in res.output
    res = run(runner, ["skeleton", "--json", skeleton_path("cifar-deep")])
    info = json.loads(res.output)
    assert info["depth"] == 3 and info["layers"][2]["fan_in"] == [16, 16]


@pytest.mark.parametrize(
    "text, code, pattern",
    [
        ("rfsgen: 1\ninput: {width: 2\n", 2, r"bad.yaml:\d+: malformed YAML"),
        ("rfsgen: 1\ninput: {width: 2}\nnodes:\n  - {name: x, base: torus}\n", 2, r"bad.yaml:4: unknown base 'torus'"),
    ],
)
def test_skeleton_errors_exit_2_with_one_line(runner, tmp_path, text, code, pattern):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    res = run(runner, ["skeleton", p])
    assert res.exit_code == code
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("rfsgen: error: ")
    import re

    assert re.search(pattern, res.stderr)


def test_kernel_command(runner, tmp_path, cifar_rows):
    np.save(tmp_path / "rows.npy", cifar_rows[:8])
    out = tmp_path / "K.npy"
    res = run(runner, ["kernel", skeleton_path("shallow-gaussian"), tmp_path / "rows.npy", "-o", out])
    assert res.exit_code == 0, res.stderr
    k = np.load(out)
    xn = cifar_rows[:8] / np.linalg.norm(cifar_rows[:8], axis=1, keepdims=True)
    np.testing.assert_allclose(k, np.exp((xn @ xn.T - 1) / 4), atol=1e-12)
    # refuses to overwrite, then does with --overwrite; cross kernel with --rows
    res = run(runner, ["kernel", skeleton_path("shallow-gaussian"), tmp_path / "rows.npy", "-o", out])
    assert res.exit_code == 2 and "already exists; pass --overwrite" in res.stderr
    res = run(runner, ["kernel", skeleton_path("shallow-gaussian"), tmp_path / "rows.npy", tmp_path / "rows.npy",
                       "--rows", "2:5", "-o", out, "--overwrite"])
    assert res.exit_code == 0
    assert np.load(out).shape == (3, 3)


def test_kernel_to_stdout_from_stdin_csv(runner, cifar_rows):
    text = "\n".join(",".join(f"{v:.17g}" for v in r) for r in cifar_rows[:3]) + "\n"
    res = runner.invoke(main, ["kernel", skeleton_path("cifar-deep"), "-", "-o", "-"], input=text)
    assert res.exit_code == 0, res.stderr
    import io

    k = np.load(io.BytesIO(res.stdout_bytes))
    assert k.shape == (3, 3)
    np.testing.assert_allclose(np.diag(k), 1.0)


def test_kernel_errors(runner, tmp_path):
    np.save(tmp_path / "wide.npy", np.ones((2, 7)))
    res = run(runner, ["kernel", skeleton_path("shallow-gaussian"), tmp_path / "wide.npy", "-o", tmp_path / "K.npy"])
    assert res.exit_code == 2
    assert "wide.npy: rows have 7 values but skeleton" in res.stderr and "expects width 1728" in res.stderr
    x = np.ones((2, 1728))
    x[1, 3] = np.inf
    np.save(tmp_path / "inf.npy", x)
    res = run(runner, ["kernel", skeleton_path("shallow-gaussian"), tmp_path / "inf.npy", "-o", tmp_path / "K.npy"])
    assert res.exit_code == 1 and "row 1, column 3: value is inf" in res.stderr
    np.save(tmp_path / "zero.npy", np.zeros((2, 1728)))
    res = run(runner, ["kernel", skeleton_path("cifar-deep"), tmp_path / "zero.npy", "-o", tmp_path / "K.npy"])
    assert res.exit_code == 1 and "row 0, node 'pixels[0, 0]': the vector is all zeros" in res.stderr
    res = run(runner, ["kernel", skeleton_path("cifar-deep"), tmp_path / "nope.npy", "-o", tmp_path / "K.npy"])
    assert res.exit_code == 2 and "no such input file" in res.stderr
    assert not (tmp_path / "K.npy").exists()
    assert not any(p.name.endswith(".part") for p in tmp_path.iterdir())


def test_sample_and_inspect(runner, tmp_path):
    out = tmp_path / "f.h5"
    res = run(runner, ["sample", skeleton_path("cifar-deep"), "-n", 500, "--seed", 3, "-o", out])
    assert res.exit_code == 0, res.stderr
    res = run(runner, ["inspect", out, "--json"])
    info = json.loads(res.output)
    for key in ("columns", "draws", "features", "seed", "mean_terms", "complexity", "bytes_per_column"):
        assert key in info
    assert info["columns"] == 500 and info["seed"] == 3 and info["complexity"] == 0.25
    assert info["draws"] >= 500 and info["features"] <= 500 and info["bytes_per_column"] < 100  # fixed HDF5 overhead dominates at D = 500
    res = run(runner, ["inspect", out])
    assert "dedup ratio q/D" in res.output and "C(S) = 0.25" in res.output
    res = run(runner, ["sample", skeleton_path("cifar-deep"), "-n", 500, "-o", out])
    assert res.exit_code == 2 and "already exists" in res.stderr
    res = run(runner, ["sample", skeleton_path("cifar-deep"), "-n", 0, "-o", tmp_path / "g.h5"])
    assert res.exit_code == 2 and "-n must be an integer from 1 to" in res.stderr
    assert not (tmp_path / "g.h5").exists()


def test_inspect_rejects_foreign_files(runner, tmp_path):
    (tmp_path / "x.h5").write_text("not hdf5")
    res = run(runner, ["inspect", tmp_path / "x.h5"])
    assert res.exit_code == 2 and "not a readable HDF5 file" in res.stderr  # an unusable input: usage error


def test_every_skeleton_error_through_the_cli(runner, tmp_path):
    """Each skeleton error of test_skeleton.ERRORS exits 2 with one line naming the file and line."""
    from test_skeleton import ERRORS

    for i, (text, pattern) in enumerate(ERRORS):
        p = tmp_path / f"e{i}.yaml"
        p.write_text(text)
        res = run(runner, ["skeleton", p])
        assert res.exit_code == 2, (i, res.stderr)
        assert res.stderr.count("\n") == 1
        import re

        assert re.search(pattern.replace("<s>", re.escape(str(p))), res.stderr), (i, res.stderr)
