"""A fuzzer of the trust boundary (issue 51; docs/design/trust.md, "The fuzzer").

Small real lakes are built once per run (:mod:`tests.fuzz.templates`); each case copies one,
changes one of its files the way an attacker who can write the folder would
(:mod:`tests.fuzz.mutate`: JSON values, numbers, keys and lengths; Parquet footers and bytes;
a file or folder replaced by a link out of the lake; a sparse 6 GiB file; names), then opens it
in a child process under a memory and a time cap with an audit hook (:mod:`tests.fuzz.child`)
and runs the reader and the read-only commands on it. The oracle: each step gives an answer or
one clear error (a ``LakeSinkError``; the CLI: exit 2 with one ``error:`` line), never another
exception, a hang or the caps hit; no file outside the lake is opened, listed, renamed or
removed; no row of the file beside the lake is ever returned.

    python -m tests.fuzz --cases 200 --seed 0        # cases 0..199, two at a time
    python -m tests.fuzz --seed 17 --cases 1 --keep  # replay case 17, keep its lake, print all

Each case is its own seed: its template, file and mutation follow from it alone, so a failing
case replays from the command printed beside it.

    python -m tests.fuzz.mutants                     # checks removed one at a time: caught?
"""
