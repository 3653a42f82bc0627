"""Self-contained HTML reports (``--html FILE``): one module per report kind, sharing ``page``.

``page`` holds what every kind needs (the Jinja2 environment, the inlined Plotly bundle, figure
serialization, number formats); ``figures`` the Plotly figures more than one kind draws; ``plan``,
``simulate``, ``search`` and ``sweep`` each turn their report object into a page. A new kind
adds a module and a template that extends ``templates/base.html.j2``. Jinja2 and Plotly are
imported only when a page is rendered, so the CLI starts as fast without ``--html``.
"""
