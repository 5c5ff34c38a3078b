"""`python -m hbpe.cli`: the `hbpe` command."""

from hbpe.cli import main

main(prog_name="hbpe")
