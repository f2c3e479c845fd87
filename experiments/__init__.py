"""The experiments: every script that writes a file under ``results/``.

The library (`flashspec`) holds what a user of speculative decoding needs; this package holds the drivers of
the paper's measurements, each with its command line: ``flashspec zoo|bandits|bench ...`` dispatch here,
and every module runs as ``python -m experiments.<name>`` from the checkout.  Every file they write has the
shape of `flashspec_lab.provenance.write_result`: ``{"provenance", "settings", "results"}``.

It is not part of the installed wheel (its generic name would collide in site-packages, and its outputs
belong to a checkout's ``results/``); `flashspec.cli` finds it next to the installed ``flashspec`` package of
an editable install or a checkout.
"""
