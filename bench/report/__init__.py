"""The README's "Performance", "Experiments", sweep and accelerator tables, generated
from the results files in bench/results/.

No figure in the README is typed by hand: `python -m bench.report` rewrites the parts
of the target file (`bench.report.readme.TARGET`, README.md) between the marker pairs of
`bench.report.readme` from the JSON the benchmarks wrote, and `--check` (run by the test
suite) fails when the file and the results disagree, or when a shipped config changed
after `python -m bench.configs` measured it.

    .venv/bin/python -m bench.report            # rewrite the README sections
    .venv/bin/python -m bench.report --check    # exit 1 if it is out of date
"""
