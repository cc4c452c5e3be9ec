"""What a towers process serves Prometheus, read as Prometheus reads it: one real HTTP
scrape of its /metrics, parsed by prometheus_client."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str, timeout: float = 5) -> str | None:
    """The text one scrape of ``url`` gets; None when nothing answers there (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read().decode()
    except OSError:
        return None


def families(url: str, timeout: float = 5) -> list:
    """The metric families one scrape of ``url`` gets (none when nothing answers)."""
    return list(text_string_to_metric_families(scrape(url, timeout) or ""))
