"""Agrona's SemanticVersion: ``major << 16 | minor << 8 | patch`` in an int32,
as the archive and cluster protocols carry their versions (only the major
version has to match between a client and a server)."""

from __future__ import annotations


def compose_version(major: int, minor: int, patch: int) -> int:
    return (major << 16) | (minor << 8) | patch


def major_version(version: int) -> int:
    return (version >> 16) & 0xFF


def version_text(version: int) -> str:
    return f"{major_version(version)}.{(version >> 8) & 0xFF}.{version & 0xFF}"
