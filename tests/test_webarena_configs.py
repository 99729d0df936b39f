"""WebArena's task configs and evaluators, on WebArena-format JSON written here, run in the real browser
against the local sites (served over HTTP as if they were WebArena's docker sites).

The local sites pick an episode's data by a cookie, which reaches the browser the way WebArena's logins
do: a Playwright storage-state file named by the config's `storage_state`, found in `auth_dir`.
Checked: the loader (placeholders, several files, a missing site, a missing login, fuzzy_match without a
judge refused, skip_unsupported), and each evaluator passing on a right episode and failing on a wrong
one: exact_match, must_include (one-character references as whole tokens), url_match with |OR| and
query values, program_html (exact_match on a form value, must_include with |OR| on a page after a state
change, `last`, the func: URL helper, other URLs read in a new tab so that `last` is still the agent's
page), and fuzzy_match through an opt-in judge.

Run: python -m pytest tests/test_webarena_configs.py
"""
import json
import re

import pytest

from envs import make
from envs.webarena_configs import must_include, url_match
from envs.websites import build_world, server

JUDGED = []


def judge(kind, intent, reference, answer):
    """A stand-in for an LLM judge: records its calls, accepts an answer that contains the reference."""
    JUDGED.append((kind, intent, reference, answer))
    return float(reference.lower() in answer)


def config(task_id, intent, start, eval_types, **spec):
    return {"task_id": task_id, "sites": [start.split("__")[1].lower()], "require_login": True,
            "storage_state": "./.auth/local_state.json", "intent": intent, "start_url": start,
            "eval": {"eval_types": eval_types, "reference_answers": None, "reference_url": "", "program_html": [],
                     **spec}}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The local sites as WebArena site URLs, a login state selecting one world, and that world."""
    srv = server.shared()
    world = build_world(0)
    srv.open_world("configs-test", world)
    root = tmp_path_factory.mktemp("webarena")
    (root / "auth").mkdir()
    state = {"cookies": [{"name": "wa_world", "value": "configs-test", "domain": "127.0.0.1", "path": "/",
                          "expires": -1, "httpOnly": False, "secure": False, "sameSite": "Lax"}], "origins": []}
    (root / "auth" / "local_state.json").write_text(json.dumps(state))
    sites = {"shopping": srv.to_local("http://onestopmarket.com").rstrip("/"),
             "shopping_admin": srv.to_local("http://luma.com/admin"),
             "reddit": srv.to_local("http://reddit.com").rstrip("/"),
             "gitlab": srv.to_local("http://gitlab.com").rstrip("/")}
    yield root, sites, world
    srv.close_world("configs-test")


def write(root, name, configs):
    folder = root / name
    folder.mkdir()
    for c in configs:
        (folder / f"{c['task_id']}.json").write_text(json.dumps(c))
    return str(folder)


def ids(obs, role, name, prefix=False):
    """The id of the element with this role and name (or a name starting so) in the observation."""
    return re.search(rf"\[(\d+)\] {role} '{re.escape(name)}{'' if prefix else chr(39)}", obs)[1]


def act(env, action):
    obs, reward, done = env.step(f"In summary, the next action I will perform is ```{action}```")
    assert "Invalid" not in obs.split("PREVIOUS ACTION:")[-1] and "could not" not in obs, obs[-300:]
    return obs, reward, done


def test_loader_checks_sites_logins_and_judge(local):
    root, sites, world = local
    product = world["store"].products[0]
    fuzzy = config(2, "Describe it", "__SHOPPING__", ["string_match"], reference_answers={"fuzzy_match": ["cheap"]})
    folder = write(root, "loader", [config(1, "Price?", "__SHOPPING__", ["string_match"],
                                           reference_answers={"exact_match": f"${product.price:,.2f}"}), fuzzy])
    auth = str(root / "auth")
    with pytest.raises(ValueError, match="need \\['judge'\\].*never scored 0 or 1 silently"):
        make("webarena", configs=folder, sites=sites, auth_dir=auth)
    with pytest.raises(ValueError, match="sites \\['shopping'\\] that `sites` does not give"):
        make("webarena", configs=folder, sites={"reddit": sites["reddit"]}, auth_dir=auth, skip_unsupported=True)
    with pytest.raises(ValueError, match="login states.*local_state.json.*auto_login"):
        make("webarena", configs=folder, sites=sites, skip_unsupported=True)
    env = make("webarena", configs=folder, sites=sites, auth_dir=auth, skip_unsupported=True)
    assert [t.config["task_id"] for t in env.task_list] == [1] and env.subtask(1) == "shopping"
    assert env.task_list[0].start_url == sites["shopping"] and env.tasks("test") == [1]  # ids: the configs' task_id
    env = make("webarena", configs=folder, sites=sites, auth_dir=auth, judge="tests.test_webarena_configs:judge")
    assert len(env.task_list) == 2
    obs = env.reset(1)
    assert "URL: http://onestopmarket.com/" in obs and "RootWebArea 'One Stop Market'" in obs  # public names
    assert act(env, f"stop [{product.price:,.2f}]")[1] == 0.0  # exact_match: the $ is part of the reference
    env.reset(1)
    assert act(env, f"stop ['${product.price:,.2f}']")[1] == 1.0  # quotes and case are cleaned away
    env.reset(2)
    JUDGED.clear()
    assert act(env, "stop [It is Cheap]")[1] == 1.0 and JUDGED == [("fuzzy_match", "Describe it", "cheap", "it is cheap")]
    env.reset(2)
    assert act(env, "stop [pricey]")[1] == 0.0
    env.close()


def test_string_and_url_evaluators(local):
    root, sites, world = local
    order = next(o for o in world["store"].orders if o.customer != "Emma Lopez")
    who = config(10, f"Who placed order #{order.number}?", f"__SHOPPING_ADMIN__/sales/order/view/order_id/{order.number}",
                 ["string_match"], reference_answers={"must_include": order.customer.split()})
    closed = config(11, "Show the closed issues of byteblaze/dotfiles", "__GITLAB__/byteblaze/dotfiles",
                    ["url_match"], reference_url="__GITLAB__/byteblaze/dotfiles/-/issues?state=closed |OR| "
                                                 "__GITLAB__/byteblaze/dotfiles/-/issues?state=merged")
    env = make("webarena", configs=write(root, "strings", [who, closed]), sites=sites, auth_dir=str(root / "auth"))
    obs = env.reset(10)
    assert f"Customer Name: {order.customer}" in obs
    assert act(env, f"stop [The order was placed by {order.customer.upper()}.]")[1] == 1.0
    env.reset(10)
    assert act(env, f"stop [{order.customer.split()[0]}]")[1] == 0.0  # every listed string must be in
    obs = env.reset(11)
    obs = act(env, f"click [{ids(obs, 'link', 'Issues ', prefix=True)}]")[0]
    assert act(env, "stop []")[1] == 0.0  # the open issues: the state query does not match
    obs = env.reset(11)
    obs = act(env, f"click [{ids(obs, 'link', 'Issues ', prefix=True)}]")[0]
    obs = act(env, f"click [{ids(obs, 'link', 'Closed ', prefix=True)}]")[0]
    assert "URL: http://gitlab.com/byteblaze/dotfiles/-/issues?state=closed" in obs
    assert act(env, "stop []")[1] == 1.0
    env.close()
    assert must_include("0", "0 issues", tokenize=True) == 1.0 and must_include("0", "10 issues", tokenize=True) == 0.0
    assert must_include("0", "10 issues") == 1.0  # without tokenizing, a substring
    assert url_match("http://h/a/b?x=1&y=2", "http://h/a/b?x=1") == 1.0
    assert url_match("http://h/a/b?x=2", "http://h/a/b?x=1 |OR| http://h/a/b?x=3") == 0.0


def test_program_html_reads_the_sites_state(local):
    root, sites, world = local
    product = world["store"].products[3]
    post = world["forum"].posts[2]
    price = config(20, f"Set the price of {product.name} to $7.77", f"__SHOPPING_ADMIN__/catalog/product/edit/id/{product.id}",
                   ["program_html"], program_html=[{
                       "url": f"__SHOPPING_ADMIN__/catalog/product/edit/id/{product.id}",
                       "locator": "document.querySelector('[aria-label=\"Price\"]').value",
                       "required_contents": {"exact_match": "7.77"}}])
    comment = config(21, f"Reply 'Nice one' to the post {post.title}", f"__REDDIT__/f/{post.forum}/{post.id}",
                     ["program_html"], program_html=[
                         {"url": "func:reddit_get_post_url('__last_url__')", "locator": "document.body.outerText",
                          "required_contents": {"must_include": ["Nice one |OR| Nice 1", "MarvelsGrantMan136"]}},
                         {"url": "last", "locator": "", "required_contents": {"must_include": ["Nice one"]}}])
    # WebArena reads a target URL in a new tab: a later `last` target still reads the agent's own page.
    tabs = config(22, f"Look at {product.name}", f"__SHOPPING_ADMIN__/catalog/product/edit/id/{product.id}",
                  ["url_match", "program_html"],
                  reference_url=f"__SHOPPING_ADMIN__/catalog/product/edit/id/{product.id}", program_html=[
                      {"url": f"__REDDIT__/f/{post.forum}/{post.id}", "locator": "document.body.outerText",
                       "required_contents": {"must_include": [post.title]}},
                      {"url": "last", "locator": "", "required_contents": {"must_include": [product.name]}}])
    env = make("webarena", configs=write(root, "programs", [price, comment, tabs]), sites=sites,
               auth_dir=str(root / "auth"))
    env.reset(22)
    assert act(env, "stop []")[1] == 1.0 and len(env.view.pages) == 1  # the evaluator's tab is closed again
    before = product.price
    obs = env.reset(20)
    assert act(env, "stop []")[1] == 0.0  # untouched: the price is still the old one
    obs = env.reset(20)
    obs = act(env, f"type [{ids(obs, 'textbox', 'Price')}] [7.77] [0]")[0]
    obs = act(env, f"click [{ids(obs, 'button', 'Save')}]")[0]
    assert "You saved the product." in obs and world["store"].product(product.id).price == 7.77 != before
    assert act(env, "stop []")[1] == 1.0
    for text, reward in (("Nice 2", 0.0), ("Nice one", 1.0)):  # the world keeps the first comment: 0 then 1
        obs = env.reset(21)
        obs = act(env, f"type [{ids(obs, 'textbox', 'Comment')}] [{text}] [0]")[0]
        obs = act(env, f"click [{ids(obs, 'button', 'Post')}]")[0]
        assert "Your comment was posted." in obs
        assert act(env, "stop []")[1] == reward
    env.close()
