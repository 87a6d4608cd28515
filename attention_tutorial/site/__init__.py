"""What each page of the site needs from the records: numbers and verdicts (small dataclasses) and figures.

One module per page or chapter, and three that all pages share: :mod:`~attention_tutorial.site.report` (the
recorded reference and live runs beside it), :mod:`~attention_tutorial.site.claims` (verdicts read from spreads)
and :mod:`~attention_tutorial.site.lesson_tables` (the small lessons' tables). The sentences stay in the page's markdown, filled by glue; a function here returns
the numbers a sentence needs, never the sentence. This layer may import everything below it (``results``,
``measure``, ``kernels``, ``train`` and the top-level modules); nothing below imports it.
"""
