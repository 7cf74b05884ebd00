"""The runtime rule book: one profile per framework, each rule citing the runtime code
that enforces it. The search, the validator and the exporters all read these rules.

Takes stage configurations, the model and the hardware; hands on rules and problems.
"""
