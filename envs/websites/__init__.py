"""Offline simulated websites for WebArena's four domains, plus WebArena's homepage.

`build_world(seed)` generates all site data (plain dataclasses: cheap to deep-copy per episode);
`make_sites(world)` wraps one world in the site objects that answer URLs; `make_tasks(world, seed)`
generates the tasks. Each site is one file: shop.py (shopping), admin.py (shopping_admin, a CMS
too), forum.py (reddit), gitlab.py (gitlab); page.py holds the node tree and its text rendering.
A site object has `name`, `host`, `title` and `page(path, query) -> (title, nodes) | None`.
Host names are WebArena's own public names for its sites (URL_MAPPINGS); nothing leaves the process.
"""
from __future__ import annotations

import random

from . import admin, forum, gitlab, shop
from .page import Node, Task, group, heading, link, parse_url, text, url

HOME = "homepage.com"


class Homepage:
    """http://homepage.com, which WebArena's prompt points to: a list of the sites."""
    name, host, title = "homepage", HOME, "Homepage"

    def page(self, path: str, query: dict[str, str]) -> tuple[str, list[Node]] | None:
        if path != "/":
            return None
        sites = [("One Stop Market (shop)", url(shop.HOST)),
                 ("Magento Admin (shop admin and CMS)", url(admin.HOST, "/admin")),
                 ("Postmill (forum)", url(forum.HOST)), ("GitLab (git host)", url(gitlab.HOST))]
        return "Homepage", [heading("Welcome to the homepage")] + [
            group("listitem", "", link(name, href), text(href)) for name, href in sites]


def page_at(sites: dict[str, object], address: str) -> tuple[str, list[Node]]:
    """(title, nodes) of any address: a site's page, its 404 page, or the unreachable-site page."""
    if address == "about:blank":
        return "", []
    host, path, query = parse_url(address)
    site = sites.get(host)
    if site is None:
        reachable = ", ".join(url(h) for h in sites)
        return host or address, [heading("This site can't be reached"),
                                 text(f"The server of {host or address!r} could not be found. "
                                      f"Reachable sites: {reachable}.")]
    page = site.page(path, query)
    if page is None:
        return "404 Not Found", [heading("404: Page Not Found"), text(f"There is no page at {path} on {host}."),
                                 link("Go to the homepage", url(HOME))]
    return page


def build_world(seed: int) -> dict:
    return {"store": shop.make_store(random.Random(seed)), "forum": forum.make_forum(random.Random(seed + 1)),
            "git": gitlab.make_git(random.Random(seed + 2))}


def make_sites(world: dict) -> dict[str, object]:
    sites = [shop.Shop(world["store"]), admin.Admin(world["store"]), forum.ForumSite(world["forum"]),
             gitlab.GitLab(world["git"]), Homepage()]
    return {s.host: s for s in sites}


def make_tasks(world: dict, seed: int, per_template: int = 8) -> list[Task]:
    """All tasks, in a fixed order: site by site, template by template. Objectives are unique."""
    out: list[Task] = []
    for i, module in enumerate((shop, admin, forum, gitlab)):
        out += module.tasks(world, random.Random(seed * 1000 + i), per_template)
    seen: set[str] = set()
    unique = [t for t in out if not (t.objective in seen or seen.add(t.objective))]
    return unique


__all__ = ["Node", "Task", "build_world", "make_sites", "make_tasks", "page_at"]
