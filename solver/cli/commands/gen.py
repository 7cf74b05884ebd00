"""``tangram gen --seed N [--gpus G] [--model NAME] [--small] [--out FILE]``: a random job."""

from __future__ import annotations

import argparse

from solver.spec.errors import InputError
from solver.studies.generate import GenOptions, Scale, generate, write_job


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``gen`` subcommand."""
    p = sub.add_parser("gen", help="generate a random but realistic job (TOML, cluster inline)")
    p.add_argument("--seed", type=int, required=True, help="seed; the same seed gives the same job")
    p.add_argument("--gpus", type=int, help="total GPUs (multiple of 8, at least 16)")
    p.add_argument("--model", help="catalog model name (default: drawn among those that fit)")
    p.add_argument("--small", action="store_true",
                   help="small jobs: 2-3 GPU kinds, 1-4 nodes each, models up to 14B")
    p.add_argument("--out", metavar="FILE", help="write the job here instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print (or write) the generated job."""
    options = GenOptions(args.seed, args.gpus, args.model,
                         Scale.SMALL if args.small else Scale.REALISTIC)
    job = generate(options)
    if args.out:
        try:
            write_job(job, args.out)
        except OSError as exc:
            raise InputError(args.out, "<file>", f"cannot write: {exc.strerror}") from None
    else:
        print(job.to_toml(), end="")
    return 0
