"""The forum (WebArena's `reddit` site, a Postmill instance), simulated.

Forums, posts, comments and users are generated from a seed; the agent is logged in as
MarvelsGrantMan136, as in WebArena. Pages: front page, forum list, forum (`/f/<name>`), post
(`/f/<name>/<id>`), submission form, search, user list and user profile.
Tasks: number of comments / author of a post / highest-scored post of a forum (info), forum page /
user profile (nav), create a post, reply with a comment, upvote a post, subscribe to a forum (state).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from .page import Node, Task, button, group, heading, link, text, textbox, url

HOST = "reddit.com"
ME = "MarvelsGrantMan136"
TOPICS = {  # forum -> (description, subjects its post titles talk about)
    "books": ("Book lovers", ["a slow summer read", "my first Tolkien", "audiobooks on commutes", "library sales",
                              "rereading classics", "a forgotten mystery series", "poetry for beginners",
                              "book clubs"]),
    "gadgets": ("Gadgets and gear", ["a cheap e-reader", "smart watches for running", "USB-C cables",
                                     "budget headphones", "phone repair kits", "a mechanical keyboard",
                                     "home weather stations", "drones"]),
    "cooking": ("Home cooking", ["sourdough starters", "cast iron care", "weeknight curries", "knife sharpening",
                                 "homemade pasta", "meal prep", "spicy pickles", "one pot dinners"]),
    "running": ("Runners", ["a first marathon", "trail shoes", "winter running", "interval training",
                            "running with a dog", "shin splints", "race day nerves", "a couch to 5k plan"]),
    "photography": ("Photographers", ["film cameras", "night sky shots", "a used prime lens", "editing workflow",
                                      "street portraits", "tripod choice", "bird photography", "printing photos"]),
    "boston": ("Boston and around", ["the Green Line", "cheap lunch spots", "snow parking rules", "Harbor Islands",
                                     "apartment hunting", "the Marathon route", "bike lanes", "weekend markets"]),
}
OPENERS = ["Thoughts on", "Question about", "My experience with", "Help with", "Tips for", "Opinions on"]
HANDLES = ["quietfox", "pixel_pusher", "rainydaze", "mapleleaf", "sunset_rider", "coffeebean", "northwind",
           "lazyotter", "bitwise", "paperplane", "tidepool", "ironkettle"]
REPLIES = ["Totally agree with this.", "I had the same problem last year.", "Thanks for sharing!",
           "Not sure this is right, check the wiki.", "Following, I want to know too.", "This helped me a lot."]


@dataclass
class Comment:
    author: str
    text: str


@dataclass
class Post:
    id: int
    forum: str
    title: str
    body: str
    author: str
    score: int
    comments: list[Comment] = field(default_factory=list)
    my_vote: int = 0


@dataclass
class Forum:
    subscribers: dict[str, int]  # forum -> subscriber count
    posts: list[Post]
    users: list[str]
    subscribed: set[str] = field(default_factory=set)

    def post(self, pid: int) -> Post | None:
        return next((p for p in self.posts if p.id == pid), None)


def make_forum(rng: random.Random) -> Forum:
    users = [f"{h}{rng.randint(10, 99)}" for h in HANDLES]
    posts = []
    for name, (_, subjects) in TOPICS.items():
        for subject in rng.sample(subjects, 6):
            comments = [Comment(rng.choice(users), rng.choice(REPLIES)) for _ in range(rng.randint(0, 5))]
            posts.append(Post(len(posts) + 1, name, f"{rng.choice(OPENERS)} {subject}",
                              f"I would like to hear what people here think about {subject}.",
                              rng.choice(users), rng.randint(-3, 120), comments))
    subscribers = {name: rng.randint(200, 9000) for name in TOPICS}
    return Forum(subscribers, posts, users, {"books"})


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class ForumSite:
    name, host, title = "reddit", HOST, "Postmill"

    def __init__(self, forum: Forum):
        self.f = forum

    def _vote(self, pid: int, vote: int, back: str):
        def handler(values):
            post = self.f.post(pid)
            post.score += vote - post.my_vote
            post.my_vote = vote
            return back, ""
        return handler

    def _article(self, p: Post, back: str) -> Node:
        up = "Retract upvote" if p.my_vote == 1 else "Upvote"
        return group("article", "", link(p.title, url(HOST, f"/f/{p.forum}/{p.id}")),
                     text(f"Submitted by {p.author} in f/{p.forum}"),
                     link(_count(len(p.comments), "comment"), url(HOST, f"/f/{p.forum}/{p.id}")),
                     button(up, self._vote(p.id, 0 if p.my_vote == 1 else 1, back)), text(f"Score: {p.score}"),
                     button("Downvote", self._vote(p.id, -1, back)))

    def page(self, path: str, query: dict[str, str]) -> tuple[str, list[Node]] | None:
        f, here = self.f, url(HOST, path, **query)
        search = lambda v: (url(HOST, "/search", q=v.get("q", "").strip()), "")  # noqa: E731
        header = [group("banner", "", link("Forums", url(HOST, "/forums")), link("Users", url(HOST, "/users")),
                        link("Submit", url(HOST, "/submit")), link(ME, url(HOST, f"/user/{ME}")),
                        textbox("Search query", "q", submit=search, role="searchbox"), button("Search", search))]
        parts = path.strip("/").split("/")
        if path == "/":
            hot = sorted(f.posts, key=lambda p: (-p.score, p.id))[:8]
            return "Postmill", header + [heading("Hot submissions")] + [self._article(p, here) for p in hot]
        if path == "/forums":
            items = [group("article", "", link(name, url(HOST, f"/f/{name}")), text(f"{subs} subscribers"))
                     for name, subs in f.subscribers.items()]
            return "List of forums", header + [heading("List of forums")] + items
        if parts[0] == "f" and len(parts) == 2 and parts[1] in f.subscribers:
            name = parts[1]
            subscribed = name in f.subscribed
            return f"/f/{name}", header + [
                heading(name), text(TOPICS[name][0]), text(f"{f.subscribers[name]} subscribers"),
                button("Unsubscribe" if subscribed else "Subscribe", self._subscribe(name, not subscribed)),
                link("Submit a new post", url(HOST, "/submit", forum=name))] + [
                self._article(p, here) for p in f.posts if p.forum == name]
        if parts[0] == "f" and len(parts) == 3 and parts[2].isdigit():
            p = f.post(int(parts[2]))
            if p is None or p.forum != parts[1]:
                return None
            comments = [group("article", "", link(c.author, url(HOST, f"/user/{c.author}")), text(c.text))
                        for c in p.comments]
            return p.title, header + [self._article(p, here), text(p.body),
                                      textbox("Comment", "comment"), button("Post", self._comment(p.id)),
                                      heading(_count(len(p.comments), "comment"))] + comments
        if path == "/submit":
            return "Create submission", header + [
                heading("Create submission"), textbox("Title", "title", submit=self._submit, required=True),
                textbox("Body", "body"), textbox("Forum", "forum", query.get("forum", ""), self._submit, required=True),
                button("Create submission", self._submit)]
        if path == "/search":
            words = query.get("q", "").lower().split()
            found = [p for p in f.posts if words and all(w in p.title.lower() for w in words)]
            return "Search results", header + [heading(f"Search results for '{query.get('q', '')}'")] + (
                [self._article(p, here) for p in found] or [text("No results.")])
        if path == "/users":
            return "Users", header + [heading("Users")] + [link(u, url(HOST, f"/user/{u}")) for u in f.users + [ME]]
        if parts[0] == "user" and len(parts) == 2 and parts[1] in f.users + [ME]:
            user = parts[1]
            mine = [p for p in f.posts if p.author == user]
            n_comments = sum(c.author == user for p in f.posts for c in p.comments)
            return user, header + [heading(user), text(_count(len(mine), "submission")),
                                   text(_count(n_comments, "comment"))] + [
                link(p.title, url(HOST, f"/f/{p.forum}/{p.id}")) for p in mine]
        return None

    def _subscribe(self, name: str, on: bool):
        def handler(values):
            if on:
                self.f.subscribed.add(name)
            else:
                self.f.subscribed.discard(name)
            self.f.subscribers[name] += 1 if on else -1
            return url(HOST, f"/f/{name}"), ""
        return handler

    def _comment(self, pid: int):
        def handler(values):
            post = self.f.post(pid)
            here = url(HOST, f"/f/{post.forum}/{pid}")
            comment = values.get("comment", "").strip()
            if not comment:
                return here, "The comment cannot be empty."
            post.comments.append(Comment(ME, comment[:2000]))
            return here, "Your comment was posted."
        return handler

    def _submit(self, values):
        title, body, forum = (values.get(k, "").strip() for k in ("title", "body", "forum"))
        forum = forum.removeprefix("f/").lower()
        if not title or forum not in self.f.subscribers:
            return url(HOST, "/submit", forum=forum), "A title and an existing forum are required."
        post = Post(max(p.id for p in self.f.posts) + 1, forum, title[:300], body[:5000], ME, 1, my_vote=1)
        self.f.posts.append(post)
        return url(HOST, f"/f/{forum}/{post.id}"), "Your submission was created."


def tasks(world: dict, rng: random.Random, n: int) -> list[Task]:
    f: Forum = world["forum"]
    home, out = url(HOST), []
    norm = lambda s: " ".join(s.lower().split())  # noqa: E731
    for p in rng.sample(f.posts, n):
        out.append(Task("reddit", "info", "n_comments", f"How many comments does the post '{p.title}' have?",
                        home, answers=(str(len(p.comments)),), params={"title": p.title}))
    for p in rng.sample(f.posts, n):
        out.append(Task("reddit", "info", "author", f"Who submitted the post '{p.title}'?", home,
                        answers=(p.author,), params={"title": p.title}))
    for name in TOPICS:
        best = max(p.score for p in f.posts if p.forum == name)  # ties: every top title is accepted
        out.append(Task("reddit", "info", "top_post", f"What is the title of the highest-scored post in f/{name}?",
                        home, answers=tuple(p.title for p in f.posts if p.forum == name and p.score == best),
                        params={"forum": name}))
    for name in TOPICS:
        out.append(Task("reddit", "nav", "forum_page", f"Open the forum f/{name}.", home,
                        url=url(HOST, f"/f/{name}"), params={"forum": name}))
    for user in rng.sample(f.users, n):
        out.append(Task("reddit", "nav", "user_page", f"Show me the profile page of the user {user}.", home,
                        url=url(HOST, f"/user/{user}"), params={"user": user}))
    for name in rng.sample(list(TOPICS), 6):
        subject = rng.choice(TOPICS[name][1])
        title, body = f"Weekly thread about {subject}", f"Share your best advice on {subject} here."
        check = lambda w, name=name, title=title, body=body: any(  # noqa: E731
            p.forum == name and p.author == ME and norm(p.title) == norm(title) and norm(p.body) == norm(body)
            for p in w["forum"].posts)
        out.append(Task("reddit", "state", "create_post", f"Create a post in f/{name} titled '{title}' with the body "
                        f"'{body}'.", home, check=check, params={"forum": name, "title": title, "body": body}))
    for p in rng.sample(f.posts, n):
        c = rng.choice(["Great point, thanks!", "I would add a link to the wiki.", "Count me in for this."])
        check = lambda w, pid=p.id, c=c: any(  # noqa: E731
            x.author == ME and norm(x.text) == norm(c) for x in w["forum"].post(pid).comments)
        out.append(Task("reddit", "state", "comment", f"Reply to the post '{p.title}' with the comment '{c}'.", home,
                        check=check, params={"title": p.title, "comment": c}))
    for p in rng.sample(f.posts, n):
        out.append(Task("reddit", "state", "upvote", f"Upvote the post '{p.title}'.", home,
                        check=lambda w, pid=p.id: w["forum"].post(pid).my_vote == 1, params={"title": p.title}))
    for name in [t for t in TOPICS if t not in f.subscribed]:
        out.append(Task("reddit", "state", "subscribe", f"Subscribe to the forum f/{name}.", home,
                        check=lambda w, name=name: name in w["forum"].subscribed, params={"forum": name}))
    return out
