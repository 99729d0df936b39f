"""The git host (WebArena's `gitlab` site), simulated.

Projects with issues (state, author, assignee, labels, comments) are generated from a seed; the
agent is logged in as byteblaze, as in WebArena. Pages: dashboard (project list), search, project
page (star / unstar), issue list filtered by `state` and `label_name` query parameters (as GitLab's
own URLs), issue page (close / reopen, comment) and the new-issue form.
Tasks: open issues / assignee / issues with a label (info), closed issues / labelled issues
(nav), close an issue, create an issue, star a project, comment on an issue (state).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from .page import Node, Task, button, group, heading, link, text, textbox, url

HOST = "gitlab.com"
ME = "byteblaze"
PROJECTS = [("byteblaze", "dotfiles", "Shell"), ("byteblaze", "solar-charts", "TypeScript"),
            ("a11yproject", "a11yproject.com", "JavaScript"), ("primer", "design-system", "CSS"),
            ("umano", "tiny-http", "Go"), ("kilian", "timeline-viewer", "Python"),
            ("vinta", "pixel-forge", "Rust"), ("yjlou", "notes-app", "Kotlin")]
USERS = ["byteblaze", "roshanjossey", "abisubramanya27", "vinta", "kilian", "yjlou", "justinwalsh", "koushik"]
LABELS = ["bug", "enhancement", "documentation", "question", "help wanted"]
VERBS = ["Fix", "Add", "Improve", "Remove", "Update", "Document", "Refactor", "Test"]
THINGS = ["dark mode toggle", "login redirect", "CSV export", "search results paging", "README badges",
          "config loader", "keyboard shortcuts", "error messages", "install script", "date parsing",
          "cache invalidation", "mobile layout"]
NOTES = ["I can reproduce this on main.", "Working on a fix now.", "Could you share the logs?",
         "This is a duplicate, closing soon.", "Thanks, merged the patch."]


@dataclass
class Issue:
    iid: int
    title: str
    state: str  # opened | closed
    author: str
    assignee: str | None
    labels: list[str]
    comments: list[tuple[str, str]] = field(default_factory=list)  # (author, text)


@dataclass
class Project:
    owner: str
    name: str
    language: str
    description: str
    stars: int
    issues: list[Issue]
    starred: bool = False

    @property
    def path(self) -> str:
        return f"{self.owner}/{self.name}"


@dataclass
class Git:
    projects: list[Project]

    def project(self, path: str) -> Project | None:
        return next((p for p in self.projects if p.path == path), None)


def make_git(rng: random.Random) -> Git:
    projects = []
    for owner, name, language in PROJECTS:
        titles = rng.sample([f"{v} {t}" for v in VERBS for t in THINGS], rng.randint(6, 9))
        issues = [Issue(i + 1, title, rng.choice(["opened", "opened", "closed"]), rng.choice(USERS),
                        rng.choice(USERS + [None]), sorted(rng.sample(LABELS, rng.randint(0, 2))),
                        [(rng.choice(USERS), rng.choice(NOTES)) for _ in range(rng.randint(0, 3))])
                  for i, title in enumerate(titles)]
        projects.append(Project(owner, name, language, f"A {language} project: {name.replace('-', ' ')}.",
                                rng.randint(0, 900), issues))
    return Git(projects)


def issues_url(project: Project, state: str = "opened", label: str = "") -> str:
    return url(HOST, f"/{project.path}/-/issues", state=state, label_name=label)


class GitLab:
    name, host, title = "gitlab", HOST, "GitLab"

    def __init__(self, git: Git):
        self.g = git

    def page(self, path: str, query: dict[str, str]) -> tuple[str, list[Node]] | None:
        g = self.g
        search = lambda v: (url(HOST, "/search", search=v.get("search", "").strip()), "")  # noqa: E731
        header = [group("banner", "", link("Projects", url(HOST)),
                        textbox("Search GitLab", "search", submit=search, role="searchbox"))]
        if path == "/":
            return "Projects · Dashboard · GitLab", header + [heading("Projects")] + [
                self._card(p) for p in g.projects]
        if path == "/search":
            words = query.get("search", "").lower().split()
            found = [p for p in g.projects if words and all(w in f"{p.path} {p.description}".lower() for w in words)]
            return "Search · GitLab", header + [heading("Search results")] + (
                [self._card(p) for p in found] or [text("We couldn't find any projects matching your search.")])
        parts = path.strip("/").split("/")
        project = g.project("/".join(parts[:2])) if len(parts) >= 2 else None
        if project is None:
            return None
        rest = parts[2:]
        if not rest:
            n_open = sum(i.state == "opened" for i in project.issues)
            return f"{project.path} · GitLab", header + [
                heading(project.name), text(project.description), text(f"Language: {project.language}"),
                text(f"Stars: {project.stars}"),
                button("Unstar" if project.starred else "Star", self._star(project.path)),
                link(f"Issues {n_open}", issues_url(project)),
                link("New issue", url(HOST, f"/{project.path}/-/issues/new"))]
        if rest == ["-", "issues"]:
            state, label = query.get("state", "opened"), query.get("label_name", "")
            pool = [i for i in project.issues if not label or label in i.labels]
            shown = [i for i in pool if state == "all" or i.state == state]
            tabs = [link(f"{name} {sum(tab == 'all' or i.state == tab for i in pool)}", issues_url(project, tab, label))
                    for name, tab in (("Open", "opened"), ("Closed", "closed"), ("All", "all"))]
            items = [group("listitem", "", link(i.title, url(HOST, f"/{project.path}/-/issues/{i.iid}")),
                           text(f"#{i.iid} · opened by {i.author}"),
                           *[link(lab, issues_url(project, state, lab)) for lab in i.labels],
                           text(f"Assignee: {i.assignee or 'none'}")) for i in shown]
            filt = [text(f"Label: {label}"), link("Clear filter", issues_url(project, state))] if label else []
            return f"Issues · {project.path} · GitLab", header + [heading("Issues")] + tabs + filt + [
                link("New issue", url(HOST, f"/{project.path}/-/issues/new"))] + (items or [text("No issues to show.")])
        if rest == ["-", "issues", "new"]:
            return f"New Issue · {project.path} · GitLab", header + [
                heading("New Issue"), textbox("Title", "title", submit=self._create(project.path), required=True),
                textbox("Description", "description"),
                button("Create issue", self._create(project.path))]
        if len(rest) == 3 and rest[:2] == ["-", "issues"] and rest[2].isdigit():
            issue = next((i for i in project.issues if i.iid == int(rest[2])), None)
            if issue is None:
                return None
            toggle = "Close issue" if issue.state == "opened" else "Reopen issue"
            notes = [group("listitem", "", text(author), text(note)) for author, note in issue.comments]
            return f"{issue.title} (#{issue.iid}) · Issues · {project.path} · GitLab", header + [
                heading(issue.title), text("Open" if issue.state == "opened" else "Closed"),
                text(f"Issue #{issue.iid} created by {issue.author}"), text(f"Assignee: {issue.assignee or 'none'}"),
                text(f"Labels: {', '.join(issue.labels) or 'none'}"),
                button(toggle, self._toggle(project.path, issue.iid)), heading("Activity")] + notes + [
                textbox("Comment", "comment"), button("Comment", self._comment(project.path, issue.iid))]
        return None

    def _card(self, p: Project) -> Node:
        return group("listitem", "", link(f"{p.owner} / {p.name}", url(HOST, f"/{p.path}")), text(p.description),
                     text(f"Stars: {p.stars}"))

    def _star(self, path: str):
        def handler(values):
            p = self.g.project(path)
            p.starred = not p.starred
            p.stars += 1 if p.starred else -1
            return url(HOST, f"/{path}"), ""
        return handler

    def _toggle(self, path: str, iid: int):
        def handler(values):
            issue = next(i for i in self.g.project(path).issues if i.iid == iid)
            issue.state = "closed" if issue.state == "opened" else "opened"
            return url(HOST, f"/{path}/-/issues/{iid}"), ""
        return handler

    def _comment(self, path: str, iid: int):
        def handler(values):
            here = url(HOST, f"/{path}/-/issues/{iid}")
            note = values.get("comment", "").strip()
            if not note:
                return here, "The comment cannot be empty."
            next(i for i in self.g.project(path).issues if i.iid == iid).comments.append((ME, note[:2000]))
            return here, "Your comment was added."
        return handler

    def _create(self, path: str):
        def handler(values):
            title = values.get("title", "").strip()
            if not title:
                return url(HOST, f"/{path}/-/issues/new"), "Title can't be blank."
            p = self.g.project(path)
            issue = Issue(max(i.iid for i in p.issues) + 1, title[:255], "opened", ME, None, [])
            p.issues.append(issue)
            return url(HOST, f"/{path}/-/issues/{issue.iid}"), ""
        return handler


def _issue(world: dict, path: str, iid: int) -> Issue:
    return next(i for i in world["git"].project(path).issues if i.iid == iid)


def tasks(world: dict, rng: random.Random, n: int) -> list[Task]:
    g: Git = world["git"]
    home, out = url(HOST), []
    norm = lambda s: " ".join(s.lower().split())  # noqa: E731
    for p in g.projects:
        out.append(Task("gitlab", "info", "open_issues", f"How many open issues does the project {p.path} have?",
                        home, answers=(str(sum(i.state == "opened" for i in p.issues)),), params={"project": p.path}))
    assigned = [(p, i) for p in g.projects for i in p.issues if i.assignee]
    for p, i in rng.sample(assigned, n):
        out.append(Task("gitlab", "info", "assignee", f"Who is assigned to the issue '{i.title}' in {p.path}?", home,
                        answers=(i.assignee,), params={"project": p.path, "issue": i.title}))
    for p in rng.sample(g.projects, n):
        label = rng.choice(LABELS)
        count = sum(i.state == "opened" and label in i.labels for i in p.issues)
        out.append(Task("gitlab", "info", "label_count", f"How many open issues labelled '{label}' does {p.path} have?",
                        home, answers=(str(count),), params={"project": p.path, "label": label}))
    for p in rng.sample(g.projects, n):
        out.append(Task("gitlab", "nav", "closed_issues", f"Show me the closed issues of {p.path}.", home,
                        url=issues_url(p, "closed"), params={"project": p.path}))
    labelled = [(p, lab) for p in g.projects for lab in LABELS
                if any(i.state == "opened" and lab in i.labels for i in p.issues)]
    for p, lab in rng.sample(labelled, n):
        out.append(Task("gitlab", "nav", "label_issues", f"Show me the open issues labelled '{lab}' in {p.path}.",
                        home, url=issues_url(p, "opened", lab), params={"project": p.path, "label": lab}))
    open_issues = [(p, i) for p in g.projects for i in p.issues if i.state == "opened"]
    for p, i in rng.sample(open_issues, n):
        check = lambda w, path=p.path, iid=i.iid: _issue(w, path, iid).state == "closed"  # noqa: E731
        out.append(Task("gitlab", "state", "close_issue", f"Close the issue '{i.title}' in {p.path}.", home,
                        check=check, params={"project": p.path, "issue": i.title}))
    for p in rng.sample(g.projects, n):
        title = f"{rng.choice(VERBS)} the {rng.choice(['changelog', 'license file', 'CI pipeline', 'issue templates'])}"
        check = lambda w, path=p.path, t=title: any(  # noqa: E731
            norm(i.title) == norm(t) and i.author == ME and i.state == "opened" for i in w["git"].project(path).issues)
        out.append(Task("gitlab", "state", "create_issue", f"Create an issue in {p.path} titled '{title}'.", home,
                        check=check, params={"project": p.path, "title": title}))
    for p in [p for p in g.projects if not p.starred]:
        out.append(Task("gitlab", "state", "star", f"Star the project {p.path}.", home,
                        check=lambda w, path=p.path: w["git"].project(path).starred, params={"project": p.path}))
    for p, i in rng.sample([(p, i) for p in g.projects for i in p.issues], n):
        c = rng.choice(["Looking into this today.", "Can we add a test for this?", "Confirmed on the latest version."])
        check = lambda w, path=p.path, iid=i.iid, c=c: any(  # noqa: E731
            a == ME and norm(t) == norm(c) for a, t in _issue(w, path, iid).comments)
        out.append(Task("gitlab", "state", "comment", f"Comment '{c}' on issue #{i.iid} of {p.path}.", home,
                        check=check, params={"project": p.path, "iid": i.iid, "comment": c}))
    return out
