"""The spider the Scrapy tests run (``scrapy runspider``): follows every
link of the start page, yields each page's URL, status and heading, and
writes the crawl's stats to ``stats_file`` when it closes."""

from __future__ import annotations

import json
from typing import Any, Iterator

import scrapy
from scrapy.http import Response


class SiteSpider(scrapy.Spider):
    name = "site"

    def __init__(self, start: str, stats_file: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.start_urls = [start]
        self.stats_file = stats_file

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, self.parse_page)

    def parse_page(self, response: Response) -> Iterator[dict[str, Any]]:
        yield {"url": response.url, "status": response.status, "heading": response.css("h1::text").get()}

    def closed(self, reason: str) -> None:
        assert self.crawler.stats is not None
        stats = {k: v for k, v in self.crawler.stats.get_stats().items() if isinstance(v, (int, float, str))}
        with open(self.stats_file, "w") as out:
            json.dump(stats, out)
