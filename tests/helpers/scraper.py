"""A scraper in a thread: a running towers process's /metrics read every few
milliseconds, as often as Prometheus would never dare, so a test sees the values it
served while it ran and, since a regularly scraped exporter waits for one more scrape
at exit, its final ones too."""

import threading
import time

from helpers.scrapes import scrape


class Scraper:
    """Scrapes `url` every `every` seconds from the start until stop(), until the
    server goes away after answering, or for at most `longest` seconds."""

    def __init__(self, url: str, every: float = 0.05, longest: float = 180):
        self.url, self.every, self.longest = url, every, longest
        self.texts: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self.longest  # bounded, whatever happens
        while not self._stop.is_set() and time.monotonic() < deadline:
            text = scrape(self.url)
            if text is not None:
                self.texts.append(text)
            elif self.texts:  # the exporter has shut down with its process
                return
            time.sleep(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
