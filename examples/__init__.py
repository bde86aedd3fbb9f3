"""Example graphs; importable as ``examples.<name>`` so workers can resolve their functions."""
