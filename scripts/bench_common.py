"""What the benchmark scripts share: arguments, interpreters, tables, JSON, the machine, plots.

Standard library only (matplotlib is imported lazily, and only by the parent process that
plots), so a measurement child can import this module on a bare CPython.

Conventions every script follows (docs/benchmarks.md, issue 5):
- every figure is a ratio of arms measured side by side in one run (this machine is shared and
  noisy, so absolute milliseconds are context, never the result);
- ``--quick`` finishes in under a minute, the default is the full mode, ``--smoke`` is the
  seconds-long mode the unit tests run to notice a script rotting;
- results go to ``--out`` (default ``runs/``, git-ignored) as JSON with the machine they ran on;
  ``--publish`` also copies the JSON to docs/results/ and the plot to docs/img/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import provisioned_pythons

REPO_ROOT = Path(__file__).resolve().parent.parent
SRC_DIR = REPO_ROOT / "components" / "src"
DOCS_IMG = REPO_ROOT / "docs" / "img"
DOCS_RESULTS = REPO_ROOT / "docs" / "results"

# The CPython versions the benchmarks compare: the supported ones (pyproject.toml, docs/pythons.md)
# and 3.10, no longer supported, whose published rows the new ones sit beside. 3.14 and 3.15 come
# from scripts/setup_pythons.sh, the others from pyenv.
BENCHMARKED_VERSIONS = ((3, 10), (3, 11), (3, 12), (3, 13), (3, 14), (3, 15))


# --engine vllm: the real worker as tests/vllm/conftest.py starts it, from the vLLM environment.
DEFAULT_VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"


def repo_relative(path: str | Path) -> str:
    """``path`` relative to the checkout when it is inside it, else as given: results are
    committed, and a reader's clone is not at the path the measurement ran in."""
    try:
        return str(Path(path).absolute().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


# A KV cache size in bytes (vLLM's start-up memory check reads a NUMA node's size otherwise),
# eager mode (torch.compile would add ~25 s to each start), no periodic stats lines.
VLLM_ARGS = [
    "--max-model-len",
    "256",
    "--kv-cache-memory-bytes",
    "64M",
    "--enforce-eager",
    "--disable-log-stats",
]
# Nothing may come from a hub: the model is built locally.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def tiny_model_dir(vllm_python: str) -> str:
    """The tiny random model's directory (built by make_tiny_model.py with the vLLM environment's
    python, once per machine, then cached)."""
    return built_model_dir([vllm_python, str(REPO_ROOT / "scripts" / "make_tiny_model.py")])


def built_model_dir(command: Sequence[str]) -> str:
    """Run a model builder (``command``: a python and a script that prints the directory it
    built last), offline, with this project's sources and scripts on its path; the directory.
    RuntimeError with the end of its stderr when it fails."""
    proc = subprocess.run(
        list(command),
        env=child_env(OFFLINE_ENV),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(command[1]).name} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def tiny_tokenizer_dir() -> str:
    """The tiny model's tokenizer directory: the mock worker's ``--model`` (built with
    ``tokenizers`` alone by make_tiny_model.py --tokenizer-only, once per machine, then cached)."""
    import make_tiny_model  # scripts/ is on sys.path: the scripts import each other this way

    out = make_tiny_model.build(make_tiny_model.DEFAULT_TOKENIZER_OUT, tokenizer_only=True)
    return str(out)


def add_mode_args(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    mode.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, seconds: only checks that the script still runs (used by the tests)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "runs",
        help="directory for the JSON result and the plot (default: runs/, git-ignored)",
    )
    parser.add_argument(
        "--publish",
        action="store_true",
        help="also copy the JSON to docs/results/ and the plot to docs/img/",
    )


def mode_name(args: argparse.Namespace) -> str:
    if getattr(args, "smoke", False):
        return "smoke"
    if getattr(args, "quick", False):
        return "quick"
    return "full"


def exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so ``finally`` blocks stop the processes a script started."""
    import signal

    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """``--engine mock|vllm``, ``--vllm-python`` and ``--model-dir``: the A/B scripts' worker on
    the mock engine (the default) or on the real one (see :func:`require_vllm_python`)."""
    parser.add_argument(
        "--engine",
        choices=("mock", "vllm"),
        default="mock",
        help="the worker's engine (vllm: the real one, on the tiny model)",
    )
    parser.add_argument(
        "--vllm-python",
        default=str(DEFAULT_VLLM_PYTHON),
        help="with --engine vllm: python of the vLLM environment "
        "(scripts/setup_vllm_env.sh prints it)",
    )
    parser.add_argument(
        "--model-dir",
        help="with --engine vllm: the model (default: the tiny random model that "
        "scripts/make_tiny_model.py builds)",
    )


def parse_ab_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """The A/B scripts' command line: ``parser``'s own arguments, the engine's
    (:func:`add_engine_args`) and the mode's; with ``--engine vllm`` it exits 2 before anything
    starts if the vLLM environment is missing, saying how to make it."""
    add_engine_args(parser)
    add_mode_args(parser)
    args = parser.parse_args(argv)
    if args.engine == "vllm" and not Path(args.vllm_python).exists():
        parser.error(
            f"--vllm-python {args.vllm_python} does not exist: run scripts/setup_vllm_env.sh"
        )
    return args


# --- interpreters -------------------------------------------------------------------------


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    major, minor = out.split(".")
    return int(major), int(minor)


def pyenv_interpreters(
    versions: Sequence[tuple[int, int]] = BENCHMARKED_VERSIONS,
) -> dict[tuple[int, int], str]:
    """The newest pyenv CPython of each of ``versions``: {(3, 11): "/.../python"}."""
    try:
        root = subprocess.run(
            ["pyenv", "root"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
        names = subprocess.run(
            ["pyenv", "versions", "--bare"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[tuple[int, int], tuple[tuple[int, ...], str]] = {}
    for name in names:
        match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", name)  # plain CPython releases only
        if not match:
            continue
        full = tuple(int(part) for part in match.groups())
        key = (full[0], full[1])
        python = Path(root) / "versions" / name / "bin" / "python"
        if key in versions and python.exists():
            if key not in found or full > found[key][0]:
                found[key] = (full, str(python))
    return {key: path for key, (_, path) in sorted(found.items())}


def project_venv_interpreters() -> dict[tuple[int, int], str]:
    """The project's ``.venv-3.X`` interpreters (they have the third-party dependencies)."""
    found = {}
    for key in BENCHMARKED_VERSIONS:
        python = REPO_ROOT / f".venv-{key[0]}.{key[1]}" / "bin" / "python"
        if python.exists():
            found[key] = str(python)
    return found


def choose_interpreters(
    requested: Sequence[str] | None, *, prefer_venvs: bool = False
) -> list[tuple[str, str]]:
    """``[(label, python), ...]``: the requested ones, or one per benchmarked CPython found.

    Without a request: pyenv's CPython 3.10-3.13 and the 3.14 and 3.15 of
    ``scripts/setup_pythons.sh`` (``prefer_venvs`` takes the project's ``.venv-3.X`` where it
    exists, for measurements that need third-party packages), falling back to the interpreter
    running this script.
    """
    if requested:
        chosen = []
        for python in requested:
            version = _version_of(python)
            label = f"{version[0]}.{version[1]}" if version else python
            chosen.append((label, python))
        return chosen
    found = pyenv_interpreters()
    found.update(provisioned_pythons.provisioned_interpreters())
    if prefer_venvs:
        found.update(project_venv_interpreters())
    if not found:
        found = {(sys.version_info[0], sys.version_info[1]): sys.executable}
    return [(f"{major}.{minor}", python) for (major, minor), python in sorted(found.items())]


def add_interpreter_args(parser: argparse.ArgumentParser, default: str) -> None:
    """``--python PATH`` (repeatable; ``default`` says which without it) and the hidden
    ``--child`` of the scripts that measure in a child process per interpreter."""
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--python",
        action="append",
        help=f"interpreter to measure (repeatable); default: {default}",
    )


def parse_interpreter_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, default: str
) -> argparse.Namespace:
    """The command line of the scripts that measure each interpreter in a child: ``parser``'s
    own arguments, the interpreters' (:func:`add_interpreter_args`, ``default`` saying which
    without ``--python``) and the mode's."""
    add_interpreter_args(parser, default)
    add_mode_args(parser)
    return parser.parse_args(argv)


def interpreters_to_measure(
    args: argparse.Namespace, *, prefer_venvs: bool = False
) -> list[tuple[str, str]]:
    """:func:`choose_interpreters` for ``--python``; a smoke run without it measures only the
    interpreter running the script."""
    if mode_name(args) == "smoke" and not args.python:
        return [(f"{sys.version_info[0]}.{sys.version_info[1]}", sys.executable)]
    return choose_interpreters(args.python, prefer_venvs=prefer_venvs)


def measure_each(
    interpreters: Sequence[tuple[str, str]], measure: Callable[[str], dict]
) -> list[dict]:
    """``measure(python)`` for each interpreter, in order, each result noting its executable."""
    results = []
    for label, python in interpreters:
        print(f"measuring CPython {label} ({python}) ...", file=sys.stderr, flush=True)
        measured = measure(python)
        measured["executable"] = repo_relative(python)
        results.append(measured)
    return results


def measure_children(
    args: argparse.Namespace, script: str, *, prefer_venvs: bool = False
) -> list[dict]:
    """:func:`measure_each` of the interpreters to measure (:func:`interpreters_to_measure`),
    each running ``script --child`` in this run's mode and printing its JSON result."""
    mode = mode_name(args)
    child = [script, "--child", *([] if mode == "full" else [f"--{mode}"])]
    return measure_each(
        interpreters_to_measure(args, prefer_venvs=prefer_venvs),
        lambda python: run_json_child([python, *child], timeout_s=1800),
    )


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a measurement child: the project's sources first on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(SRC_DIR), str(Path(__file__).resolve().parent)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def run_json_child(argv: Sequence[str], *, timeout_s: float, env: dict | None = None) -> dict:
    """Run a child that prints one JSON document as its last stdout line; return it."""
    proc = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env if env is not None else child_env(),
        cwd=REPO_ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"child {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
        )
    last = proc.stdout.strip().splitlines()[-1]
    return json.loads(last)


# --- numbers ------------------------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): an observed value, no interpolation."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def summarise(samples: Iterable[Sequence[float]]) -> dict:
    """Latency samples in seconds, pooled: their count and p50, p99, p99.9 and max in ms."""
    pooled = [value for sample in samples for value in sample]
    return {
        "n": len(pooled),
        "p50_ms": 1000 * percentile(pooled, 50),
        "p99_ms": 1000 * percentile(pooled, 99),
        "p999_ms": 1000 * percentile(pooled, 99.9),
        "max_ms": 1000 * max(pooled) if pooled else float("nan"),
    }


# --- the machine --------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=REPO_ROOT,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": list(load) if load else None,
        "git_commit": git_commit(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def run_dir(root: Path, name: str, announce: str) -> Path:
    """Say which run starts (``announce``, on stderr) and make its directory ``root/name``."""
    print(announce, file=sys.stderr, flush=True)
    path = root / name
    path.mkdir(parents=True)
    return path


def new_result(name: str, mode: str, **fields) -> dict:
    """A result document: the benchmark's name, its mode and the machine, then ``fields``."""
    return {"benchmark": name, "mode": mode, "machine": machine_info(), **fields}


# --- output -------------------------------------------------------------------------------


def _cell(value) -> str:
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        if value != 0 and abs(value) < 0.001:
            return f"{value:.1e}"
        return f"{value:.4f}"
    return str(value)


def format_table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A Markdown table (pastes into docs/benchmarks.md as it is)."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=False)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=False)) + " |"
        for row in cells
    ]
    return "\n".join(lines)


def write_result(args: argparse.Namespace, name: str, result: dict) -> Path:
    """Write ``<out>/<name>[-quick|-smoke].json``; with --publish copy it to docs/results/."""
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    mode = mode_name(args)
    stem = name if mode == "full" else f"{name}-{mode}"
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    result.setdefault("machine", {})["loadavg_at_end"] = list(load) if load else None
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    if getattr(args, "publish", False):
        DOCS_RESULTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOCS_RESULTS / path.name)
    return path


def plot_path(args: argparse.Namespace, name: str) -> Path:
    mode = mode_name(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return Path(args.out) / (f"{name}.png" if mode == "full" else f"{name}-{mode}.png")


def publish_plot(args: argparse.Namespace, path: Path | None) -> None:
    if path is not None and getattr(args, "publish", False):
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, DOCS_IMG / path.name)


def save_plot(args: argparse.Namespace, fig, name: str, title: str) -> Path:
    """Title ``fig``, lay it out, save it as ``<out>/<name>[-mode].png`` and close it: its path."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = plot_path(args, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def finish(args: argparse.Namespace, name: str, result: dict, plot: Path | None) -> int:
    """Record the plot in ``result``, write the result (and publish both with --publish), say
    where they went; the script's exit code."""
    result["plot"] = repo_relative(plot) if plot else None
    json_path = write_result(args, name, result)
    publish_plot(args, plot)
    print(f"wrote {json_path}" + (f" and {plot}" if plot else ""))
    return 0


def pyplot():
    """matplotlib's pyplot on a file backend, or ``None`` (plots are optional: extra 'bench')."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
