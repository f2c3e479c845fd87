"""Offline corpora: deterministic, split into train and held-out text, licensed (flashspec_lab.corpora)."""
from __future__ import annotations

import ast

import pytest

from flashspec_lab import corpora, zoo


@pytest.fixture(scope="module")
def micro_corpora() -> dict[str, corpora.DomainCorpus]:
    return corpora.assemble(zoo.SIZES["micro"].train_chars_per_domain)


def test_corpora_are_deterministic_split_and_licensed(micro_corpora: dict[str, corpora.DomainCorpus]) -> None:
    again = corpora.assemble(zoo.SIZES["micro"].train_chars_per_domain)
    assert set(micro_corpora) == set(corpora.DOMAINS)
    for domain, corpus in micro_corpora.items():
        assert corpus.sha256 == again[domain].sha256
        assert len(corpus.train_text) == zoo.SIZES["micro"].train_chars_per_domain
        assert corpus.heldout_text and corpus.licence == corpora.LICENCES[domain]
        assert corpus.heldout_text[:200] not in corpus.train_text
    assert "def " in micro_corpora["python"].train_text
    assert "#include" in micro_corpora["cpp"].train_text or "namespace" in micro_corpora["cpp"].train_text
    assert ">>>" not in micro_corpora["prose"].train_text
    with pytest.raises(ValueError, match="domain"):
        corpora.assemble_domain("poetry", 1000)


def test_strip_docstrings_keeps_code_and_drops_prose() -> None:
    source = ('"""Module doc."""\nimport os\n\n\nclass A:\n    """Class doc,\n    two lines."""\n\n'
              '    def f(self):\n        """Only a docstring."""\n\n    def g(self):\n        \'\'\'Doc.\'\'\'\n'
              '        return os.sep  # kept\n')
    stripped = corpora.strip_docstrings(source)
    assert "doc" not in stripped.lower() and "two lines" not in stripped
    assert "import os" in stripped and "return os.sep  # kept" in stripped
    assert "        pass\n" in stripped  # f's body was only its docstring
    ast.parse(stripped)
    assert corpora.strip_docstrings("def broken(:\n") == "def broken(:\n"  # unparsable text is left alone
