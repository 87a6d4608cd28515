"""What each page of the site needs from the records: numbers and verdicts (small dataclasses) and figures.

One module per page or chapter. The sentences stay in the page's markdown, filled by glue; a function here returns
the numbers a sentence needs, never the sentence. This layer may import everything below it (``results``,
``measure``, ``kernels``, ``train`` and the top-level modules); nothing below imports it.
"""
