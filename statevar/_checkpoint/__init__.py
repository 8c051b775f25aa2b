"""Checkpoints: save and restore, the manager of numbered checkpoints, the manifest, name
matching and background saves."""
