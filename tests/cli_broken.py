"""A module ``--agent`` names whose own code fails as it is imported."""

raise ValueError("settings are invalid:\n  database: missing\n  api key: missing")
