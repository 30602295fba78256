"""Action: `agentload predict make sim|model-f|entry`: a prediction file from the simulator over
fresh seeds, model F on the frozen plans, or the entry model.

A module of its own (cli.commands.ACTIONS): the makers import the simulator, the run code and the
theory models, which `predict freeze` (cli/predict.py) has no use for.
"""

from __future__ import annotations

import argparse
from typing import Any

from harness.errors import UsageError
from prereg.margin import DEFAULT_MAX_CHANGE, DEFAULT_TOLERANCE
from prereg.predict_makers import DEFAULT_VALUE_QUANTITIES
from prereg.predict_sim import simulator_predictions
from prereg.predict_theory import entry_predictions, model_f_predictions
from prereg.predictions import write_predictions


def _floats(text: str | None) -> list[float] | None:
    return None if not text else [float(x) for x in text.split(",") if x.strip()]


def _strs(text: str | None) -> list[str] | None:
    return None if not text else [x.strip() for x in text.split(",") if x.strip()]


def _write(pf: Any, out: str) -> int:
    p = write_predictions(pf, out)
    kinds: dict[str, int] = {}
    for x in pf.predictions:
        kinds[x.kind] = kinds.get(x.kind, 0) + 1
    print(f"wrote {p}: {len(pf.predictions)} predictions ({', '.join(f'{v} {k}' for k, v in kinds.items())})")
    print(f"freeze it before the runs: agentload predict freeze {p}")
    return 0


def _cmd_make_sim(args: argparse.Namespace) -> int:
    layers = ["fresh"] + (["exact"] if args.exact else [])
    pf = simulator_predictions(
        args.test,
        n_seeds=args.seeds,
        first_seed=args.first_seed,
        arms=_strs(args.arms),
        rates=_floats(args.rates),
        layers=layers,
        value_quantities=_strs(args.values) or DEFAULT_VALUE_QUANTITIES,
        tolerance_sd=args.tolerance_sd,
        band=args.band,
        registration=args.registration,
        jobs=args.jobs,
        work_dir=args.work,
        name=args.name,
        margins=not args.no_margins,
        margin_tolerance=args.margin_tolerance,
        margin_max_change=args.margin_max_change,
        e0a=args.e0a,
    )
    return _write(pf, args.out)


def _cmd_make_fluid(args: argparse.Namespace) -> int:
    intervals = []
    for x in _strs(args.intervals) or []:
        a, _, b = x.partition(":")
        try:
            intervals.append((float(a), float(b)))
        except ValueError:
            raise UsageError(f"--intervals {x!r}: expected START:END in seconds, e.g. 3000:8700") from None
    pf = model_f_predictions(
        args.test,
        arms=_strs(args.arms),
        rates=_floats(args.rates),
        slope_tolerance=args.slope_tolerance,
        completions_tolerance=args.completions_tolerance,
        intervals=intervals,
        wave=args.wave,
        trap_state=args.trap_state,
        registration=args.registration,
        name=args.name,
    )
    return _write(pf, args.out)


def _cmd_make_entry(args: argparse.Namespace) -> int:
    grid = [int(x) for x in args.grid.split(",")] if args.grid else (16, 20, 24, 32, 48, 96, 300)
    pf = entry_predictions(
        args.cell, args.workload, grid=grid, crossing_tolerance=args.crossing_tolerance, name=args.name
    )
    return _write(pf, args.out)


def register(cli: Any) -> None:
    """Fill `agentload predict make`'s parser (cli/predict.py adds it) with its three sources."""
    mk = cli.action_parser("predict", "make")
    msub = mk.add_subparsers(dest="maker", metavar="SOURCE")

    s = msub.add_parser(
        "sim", help="the simulator over N fresh seeds: per-run state / stuck probabilities, values, rule probability"
    )
    s.add_argument(
        "test", help="test YAML, or a registration file (its registered test; --registration defaults to it)"
    )
    s.add_argument("--out", required=True, help="prediction file to write (YAML)")
    s.add_argument("--seeds", type=int, default=3, help="number of fresh seeds (default 3)")
    s.add_argument(
        "--first-seed", type=int, default=1000, help="first fresh seed (default 1000; must avoid the test's seeds)"
    )
    s.add_argument("--arms", help="comma-separated arms (default: the test's)")
    s.add_argument("--rates", help="comma-separated rates (default: the test's)")
    s.add_argument(
        "--values",
        help="comma-separated run statistics to predict as values (default hit,followup_hit,slope,token_ratio)",
    )
    s.add_argument(
        "--tolerance-sd", type=float, default=2.0, help="value tolerance in fresh-seed standard deviations (default 2)"
    )
    s.add_argument("--band", action="store_true", help="value tolerance: the band [min, max] the fresh seeds spanned")
    s.add_argument(
        "--exact",
        action="store_true",
        help="also simulate the registered seeds' own frozen plans and freeze those calls",
    )
    s.add_argument("--registration", help="the registration the predictions are about (its SHA-256 goes in the file)")
    s.add_argument("--jobs", type=int, default=1, help="parallel simulations")
    s.add_argument("--work", help="keep the simulated runs in this folder (default: a temporary one)")
    s.add_argument("--name", help="name of the prediction file (default <test>-simulator)")
    s.add_argument(
        "--margin-tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"flip margins: the bisection's tolerance, a relative change (default {DEFAULT_TOLERANCE:g})",
    )
    s.add_argument(
        "--margin-max-change",
        type=float,
        default=DEFAULT_MAX_CHANGE,
        help=f"flip margins: the largest relative change tried (default {DEFAULT_MAX_CHANGE:g})",
    )
    s.add_argument(
        "--e0a",
        help="E0a summary whose seed spread is the knife-edge noise (default: the E0a input the registration binds)",
    )
    s.add_argument(
        "--no-margins",
        action="store_true",
        help="no flip margins (faster; the predictions then carry no robust / knife-edge label)",
    )
    s.set_defaults(func=_cmd_make_sim)

    f = msub.add_parser(
        "model-f", help="model F driven by each seed's exact frozen plan: slopes, completions, backlog, stuck calls"
    )
    f.add_argument(
        "test", help="test YAML, or a registration file (its registered test; --registration defaults to it)"
    )
    f.add_argument("--out", required=True)
    f.add_argument("--arms")
    f.add_argument("--rates")
    f.add_argument(
        "--slope-tolerance", type=float, default=0.004, help="absolute tolerance on window slopes, sessions/s"
    )
    f.add_argument(
        "--completions-tolerance", type=float, default=0.006, help="absolute tolerance on completions, sessions/s"
    )
    f.add_argument(
        "--intervals",
        help="extra START:END intervals for slopes and completions, comma-separated (e.g. 3000:8700,6600:8700)",
    )
    f.add_argument(
        "--wave",
        action="store_true",
        help="predict the burst cohort's median completion (MIRROR's wave, +-0.15 (F - t_burst))",
    )
    f.add_argument(
        "--trap-state",
        action="store_true",
        help="asymptotic trap-state targets per run: S1 prompt, S3 completions, S4 slope",
    )
    f.add_argument("--registration")
    f.add_argument("--name")
    f.set_defaults(func=_cmd_make_fluid)

    e = msub.add_parser("entry", help="the first-principles entry model: mu(n), 0.5-hit crossing, onset, peak ratio")
    e.add_argument("--cell", required=True)
    e.add_argument("--workload", default="standard")
    e.add_argument("--grid", help="comma-separated closed populations (default the 300k Stage C grid)")
    e.add_argument("--crossing-tolerance", type=float, default=3.0, help="sessions (default 3, the paper's)")
    e.add_argument("--out", required=True)
    e.add_argument("--name")
    e.set_defaults(func=_cmd_make_entry)
