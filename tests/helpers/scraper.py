"""A scraper in a thread: a running towers process's /metrics read every few
milliseconds, as often as Prometheus would never dare, so a test sees the values it
served while it ran and, since a regularly scraped exporter waits for one more scrape
at exit, its final ones too."""

import random
import socket
import threading
import time

from helpers.scrapes import scrape


def unclaimable_ports(count: int = 1) -> int:
    """The first of `count` consecutive ports free now and below the kernel's ephemeral
    range, for a server a Scraper polls before it is up. In that range the kernel hands
    ports out to outgoing connections: to another process's, or to the scraper's own
    connect to the port (TCP's self-connect), and the server then finds its port in
    use. Linux (the range is read from /proc)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    for first in random.sample(range(10000, ephemeral - count), 200):
        sockets = [socket.socket() for _ in range(count)]
        try:
            for port, held in enumerate(sockets, start=first):
                held.bind(("", port))
            return first
        except OSError:
            continue
        finally:
            for held in sockets:
                held.close()
    raise AssertionError(f"no {count} free consecutive ports below {ephemeral}")


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
