"""Commands: `agentload prereg fill`, `prereg check` and `prereg design` (docs/registration.md)."""

from __future__ import annotations

import json
from typing import Any

from prereg.check import check_registration, format_check
from prereg.decidable import undecidable_reasons
from prereg.fill import fill_to_file
from prereg.registration import RegistrationError, load_registration


def _cmd_fill(args: Any) -> int:
    sha, res = fill_to_file(args.inputs, args.test, args.out, name=args.name)
    s = res.summary()
    if args.json:
        print(json.dumps({"path": args.out, "sha256": sha, **s}, indent=2))
        return 0
    w, band, cap, drain = s["window"], s["band"], s["cap"], s["drain"]
    print(f"registration {s['name']}: {s['status']}  ->  {args.out}")
    print(f"  sha256  {sha}")
    if w:
        hi = "-" if w["high"] is None else f"{w['high']:g}"
        print(
            f"  window  ({w['low']:g}, {hi}) x lambda_ref, upper edge from {w['binding']} "
            f"(mu*/lambda_ref = {w['mu_star_over_lambda_ref']:.3f}, E0b edge = {w['e0b_edge']})"
        )
    if band:
        print(f"  band    ({band['low']:g}, {band['high']:g}), strict")
    if s["rates"]:
        print("  rates   " + ", ".join(f"{m:g} ({x:.4f}/s)" for m, x in zip(s["rates"], s["rates_sessions_per_s"])))
    if cap:
        print(f"  cap     {cap['cap']} (argmax {cap['argmax']}{', ambiguous' if cap['ambiguous'] else ''})")
    if drain:
        per = ", ".join(
            f"{d['rate']:g}: {d['drain_s']:.0f} s{'' if d['fits'] else ' (does not fit)'}"
            for d in drain["per_rate"]
            if d["drain_s"] is not None
        )
        print(
            f"  drain   {per}; budget {drain['budget_s']:.0f} s; fits up to {drain['largest_fitting_multiple']:.2f} x "
            "lambda_ref"
        )
    for w_ in s["warnings"]:
        v = "" if w_["value"] is None else f" = {w_['value']:.3f}"
        print(f"  warning {w_['id']}{v}: {w_['text']}")
    for r in s["status_reasons"]:
        print(f"  INCOMPLETE: {r}")
    for r in undecidable_reasons(res.registration):
        print(f"  UNDECIDABLE: {r}")
    design = res.registration.fill.get("design")
    if design:
        print(
            f"  design  {design['path']} (sha256 {design['sha256'][:12]}): "
            f"{'decisive' if design['decisive'] else 'NOT decisive'}"
        )
    return 0


def _cmd_check(args: Any) -> int:
    res = check_registration(
        args.registration,
        expect_sha256=args.expect_sha256,
        remote=args.remote,
        branch=args.branch,
        plans=not args.no_plans,
        allow_exploratory=args.exploratory,
    )
    if args.json:
        print(json.dumps(res.to_json(), indent=2, default=str))
    else:
        print(format_check(res))
        try:
            reasons = undecidable_reasons(load_registration(args.registration))
        except RegistrationError:
            reasons = []
        for r in reasons:  # not a refusal of the check: `agentload submit` refuses it unless told --accept-undecidable
            print(f"UNDECIDABLE: {r}")
    return 0 if res.ok else 1


def register(cli: Any) -> None:
    """Add `agentload prereg fill|check|design`."""
    p = cli.command(
        "prereg",
        group="calibrate",
        help="fill a registration by formula from calibration inputs; check one before submitting",
    )
    p.set_defaults(_parser=p)
    sub = p.add_subparsers(dest="prereg_command", metavar="ACTION")
    f = sub.add_parser(
        "fill",
        help="fill a registration from calibration summaries and a template",
        description="Fill a registration by formula (docs/registration.md): the same inputs give the same bytes.",
    )
    f.add_argument("--inputs", help="folder with stage-c.yaml, e0a.yaml, e0b.yaml (not needed for a derived template)")
    f.add_argument("--test", required=True, help="registration template (prereg/templates/*.yaml)")
    f.add_argument("--out", required=True, help="registration file to write")
    f.add_argument("--name", help="registration name (default: the template's)")
    f.add_argument("--json", action="store_true", help="print the fill summary as JSON")
    f.set_defaults(func=_cmd_fill)
    c = sub.add_parser(
        "check",
        help="hash, status, inputs, git state and label of a registration; refusals named",
        description="Check a registration before submitting jobs (exit 1 when refused).",
    )
    c.add_argument("registration")
    c.add_argument("--expect-sha256", help="refuse unless the file has this SHA-256")
    c.add_argument("--remote", help="git remote to ask (default: the branch's upstream, else origin)")
    c.add_argument("--branch", help="remote branch to ask (default: the upstream branch, else the current one)")
    c.add_argument("--no-plans", action="store_true", help="skip regenerating the frozen plans")
    c.add_argument("--exploratory", action="store_true", help="accept an EXPLORATORY registration (exploratory runs)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_check)
    cli.deferred_action(sub, "prereg", "design")  # its own module: cli/design.py
