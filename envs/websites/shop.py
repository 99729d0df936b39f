"""The shop (WebArena's `shopping` site, a Magento store called One Stop Market), simulated.

Store data (products, customers, orders, cart, wish list, CMS pages) is generated from a seed and
shared with the admin panel (admin.py), so a change made in one shows in the other. The shopper is
logged in as Emma Lopez, as in WebArena. Pages: home, category, product (`/<slug>.html`), search
(`/catalogsearch/result?q=`), cart, checkout, account, order history, order view, wish list, CMS pages.
Tasks: price / order total / cheapest product (info), search results / product page (nav),
add to or remove from the wish list and buy a product (state).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from .page import Node, Task, button, group, heading, link, row, slug, text, textbox, url

HOST = "onestopmarket.com"
SHOPPER = "Emma Lopez"
CATEGORIES = {  # name -> (products, price range)
    "Electronics": (["Wireless Mouse", "Bluetooth Speaker", "USB-C Hub", "Noise Cancelling Headphones",
                     "Webcam", "Mechanical Keyboard", "Power Bank", "Smart Plug"], (9, 180)),
    "Home and Kitchen": (["Coffee Grinder", "Cast Iron Skillet", "Bamboo Cutting Board", "Electric Kettle",
                          "Chef Knife", "Glass Food Containers", "Table Lamp", "Throw Blanket"], (8, 120)),
    "Beauty and Personal Care": (["Vitamin C Serum", "Hair Dryer", "Toothbrush Set", "Lip Balm Pack",
                                  "Facial Cleanser", "Beard Trimmer", "Sunscreen SPF 50", "Body Lotion"], (4, 90)),
    "Grocery": (["Green Tea", "Dark Chocolate Bar", "Organic Honey", "Espresso Beans", "Trail Mix",
                 "Olive Oil", "Maple Syrup", "Rice Crackers"], (3, 40)),
    "Sports and Outdoors": (["Yoga Mat", "Water Bottle", "Resistance Bands", "Camping Lantern", "Running Socks",
                             "Jump Rope", "Trekking Poles", "Foam Roller"], (6, 150)),
}
BRANDS = ["Nordhaven", "Kestrel", "Lumio", "Ardent", "Bramble", "Solvi", "Tandem", "Quillon", "Veloce", "Marlow"]
FIRST = ["Alex", "Sam", "Grace", "Omar", "Lucia", "Ken", "Priya", "Jonas", "Mia", "Tom", "Aisha", "Leo"]
LAST = ["Chen", "Novak", "Okafor", "Silva", "Berg", "Tanaka", "Moreau", "Kowalski", "Haddad", "Reyes"]
STATUSES = ["Pending", "Processing", "Complete", "Canceled"]
CMS = {"About us": "One Stop Market sells everyday goods since 2015.",
       "Customer Service": "Our team answers questions within one business day.",
       "Privacy Policy": "We never sell the personal data of our customers.",
       "Shipping Information": "Orders ship within two days from our warehouse.",
       "Returns and Exchanges": "Items can be returned within 30 days of delivery."}


@dataclass
class Product:
    id: int
    sku: str
    name: str
    category: str
    price: float
    qty: int
    rating: int
    enabled: bool = True


@dataclass
class Order:
    number: str
    customer: str
    date: str
    status: str
    items: list[tuple[int, int]]  # (product id, quantity)
    total: float
    comments: list[str] = field(default_factory=list)


@dataclass
class Customer:
    id: int
    name: str
    email: str
    city: str


@dataclass
class CmsPage:
    id: int
    title: str
    key: str
    content: str
    enabled: bool = True


@dataclass
class Store:
    products: list[Product]
    customers: list[Customer]
    orders: list[Order]
    pages: list[CmsPage]
    cart: dict[int, int] = field(default_factory=dict)
    wishlist: list[int] = field(default_factory=list)

    def product(self, pid: int) -> Product:
        return next(p for p in self.products if p.id == pid)

    def order(self, number: str) -> Order | None:
        return next((o for o in self.orders if o.number == number), None)

    def total(self, items) -> float:
        return round(sum(self.product(pid).price * q for pid, q in items), 2)

    def place_order(self, customer: str, items: list[tuple[int, int]]) -> Order:
        number = f"{int(max(o.number for o in self.orders)) + 1:09d}"
        order = Order(number, customer, "2023-06-01", "Pending", items, self.total(items))
        self.orders.append(order)
        return order


def make_store(rng: random.Random) -> Store:
    products = []
    for category, (names, (lo, hi)) in CATEGORIES.items():
        for name in names:
            pid = len(products) + 1
            products.append(Product(pid, f"{category[:2].upper()}-{1000 + pid}", f"{rng.choice(BRANDS)} {name}",
                                    category, round(rng.uniform(lo, hi), 2), rng.randint(0, 200), rng.randint(1, 5)))
    names = [SHOPPER] + rng.sample([f"{f} {l}" for f in FIRST for l in LAST], 11)
    cities = ["Boston", "Austin", "Denver", "Seattle", "Chicago", "Miami"]
    customers = [Customer(i + 1, n, f"{n.lower().replace(' ', '.')}@gmail.com", rng.choice(cities))
                 for i, n in enumerate(names)]
    store = Store(products, customers, [], [CmsPage(i + 1, t, slug(t), c) for i, (t, c) in enumerate(CMS.items())])
    for i in range(36):
        items = [(p.id, rng.randint(1, 3)) for p in rng.sample(products, rng.randint(1, 3))]
        customer = SHOPPER if i % 3 == 0 else rng.choice(names[1:])
        store.orders.append(Order(f"{100 + i:09d}", customer, f"2023-{1 + i // 8:02d}-{1 + (i * 7) % 28:02d}",
                                  rng.choice(STATUSES), items, store.total(items)))
    store.wishlist = [p.id for p in rng.sample(products, 3)]
    return store


def money(x: float) -> str:
    return f"${x:,.2f}"


class Shop:
    name, host, title = "shopping", HOST, "One Stop Market"

    def __init__(self, store: Store):
        self.s = store

    def _add_to_cart(self, pid: int, back: str):
        def handler(values):
            qty = values.get("qty", "1").strip() or "1"
            if not qty.isdigit() or not 1 <= int(qty) <= 99:
                return back, "Please enter a quantity from 1 to 99."
            self.s.cart[pid] = self.s.cart.get(pid, 0) + int(qty)
            return back, f"You added {self.s.product(pid).name} to your shopping cart."
        return handler

    def _wish(self, pid: int, back: str, add: bool):
        def handler(values):
            if add and pid not in self.s.wishlist:
                self.s.wishlist.append(pid)
            if not add and pid in self.s.wishlist:
                self.s.wishlist.remove(pid)
            verb = "added to" if add else "removed from"
            return back, f"{self.s.product(pid).name} has been {verb} your Wish List."
        return handler

    def _card(self, p: Product, back: str) -> Node:
        return group("article", "", link(p.name, url(HOST, f"/{slug(p.name)}.html")), text(money(p.price)),
                     text(f"Rating: {p.rating} out of 5"), button("Add to Cart", self._add_to_cart(p.id, back)),
                     button("Add to Wish List", self._wish(p.id, back, True)))

    def page(self, path: str, query: dict[str, str]) -> tuple[str, list[Node]] | None:
        s, here = self.s, url(HOST, path, **query)
        search = lambda v: (url(HOST, "/catalogsearch/result", q=v.get("q", "").strip()), "")  # noqa: E731
        header = [group("banner", "", link("My Account", url(HOST, "/customer/account")),
                        link("My Wish List", url(HOST, "/wishlist")),
                        link(f"My Cart ({sum(s.cart.values())})", url(HOST, "/checkout/cart")),
                        textbox("Search entire store here...", "q", submit=search, role="searchbox"),
                        button("Search", search)),
                  group("navigation", "", *[link(c, url(HOST, f"/{slug(c)}.html")) for c in CATEGORIES])]
        live = [p for p in s.products if p.enabled]
        mine = [o for o in s.orders if o.customer == SHOPPER]
        if path == "/":
            top = sorted(live, key=lambda p: (-p.rating, p.id))[:6]
            footer = [link(p.title, url(HOST, f"/{p.key}")) for p in s.pages if p.enabled]
            return self.title, header + [heading("Top rated products")] + [
                self._card(p, here) for p in top] + [group("contentinfo", "", *footer)]
        for category in CATEGORIES:
            if path == f"/{slug(category)}.html":
                items = [p for p in live if p.category == category]
                return category, header + [heading(category)] + [self._card(p, here) for p in items]
        for p in live:
            if path == f"/{slug(p.name)}.html":
                return p.name, header + [
                    heading(p.name), text(money(p.price)), text("In stock" if p.qty else "Out of stock"),
                    text(f"SKU: {p.sku}"), text(f"Rating: {p.rating} out of 5"), textbox("Qty", "qty", "1", submit=self._add_to_cart(p.id, here)),
                    button("Add to Cart", self._add_to_cart(p.id, here)),
                    button("Add to Wish List", self._wish(p.id, here, True))]
        if path == "/catalogsearch/result":
            q = query.get("q", "").lower().split()
            found = [p for p in live if q and all(w in p.name.lower() for w in q)]
            body = [self._card(p, here) for p in found] or [text("Your search returned no results.")]
            return f"Search results for: '{query.get('q', '')}'", header + [
                heading(f"Search results for: '{query.get('q', '')}'")] + body
        if path == "/checkout/cart":
            items = [group("row", "", link(s.product(i).name, url(HOST, f"/{slug(s.product(i).name)}.html")),
                           text(money(s.product(i).price)), text(f"Qty: {q}"),
                           button("Remove item", self._remove_from_cart(i))) for i, q in s.cart.items()]
            go = [button("Proceed to Checkout", lambda v: (url(HOST, "/checkout"), ""))] if s.cart else []
            return "Shopping Cart", header + [heading("Shopping Cart")] + (items or [
                text("You have no items in your shopping cart.")]) + [
                text(f"Order Total: {money(s.total(s.cart.items()))}")] + go
        if path == "/checkout" and s.cart:
            return "Checkout", header + [heading("Checkout"), text(f"Ship to: {SHOPPER}, Boston"),
                                         text(f"Order Total: {money(s.total(s.cart.items()))}"),
                                         button("Place Order", self._place_order)]
        if path == "/checkout/onepage/success":
            return "Success Page", header + [heading("Thank you for your purchase!"),
                                             text(f"Your order number is: {query.get('order', '')}."),
                                             link("Continue Shopping", url(HOST))]
        if path == "/customer/account":
            return "My Account", header + [heading("My Account"), text(SHOPPER), text("emma.lopez@gmail.com"),
                                           link("My Orders", url(HOST, "/sales/order/history")),
                                           link("My Wish List", url(HOST, "/wishlist"))]
        if path == "/sales/order/history":
            rows = [row(o.number, o.date, money(o.total), o.status,
                        link("View Order", url(HOST, f"/sales/order/view/order_id/{o.number}"))) for o in mine[::-1]]
            columns = [Node("columnheader", c) for c in ("Order #", "Date", "Order Total", "Status", "Action")]
            return "My Orders", header + [heading("My Orders"), row(*columns)] + rows
        if path.startswith("/sales/order/view/order_id/"):
            o = s.order(path.rsplit("/", 1)[1])
            if o is None or o.customer != SHOPPER:
                return None
            items = [row(s.product(i).name, money(s.product(i).price), f"Qty: {q}") for i, q in o.items]
            return f"Order # {o.number}", header + [heading(f"Order # {o.number}"), text(f"Status: {o.status}"),
                                                    text(f"Order Date: {o.date}")] + items + [
                text(f"Grand Total: {money(o.total)}")]
        if path == "/wishlist":
            items = [group("article", "", link(s.product(i).name, url(HOST, f"/{slug(s.product(i).name)}.html")),
                           text(money(s.product(i).price)), button("Remove item", self._wish(i, here, False)))
                     for i in s.wishlist]
            return "My Wish List", header + [heading("My Wish List")] + (
                items or [text("You have no items in your wish list.")])
        for p in s.pages:
            if p.enabled and path == f"/{p.key}":
                return p.title, header + [heading(p.title), text(p.content)]
        return None

    def _remove_from_cart(self, pid: int):
        def handler(values):
            self.s.cart.pop(pid, None)
            return url(HOST, "/checkout/cart"), "The item was removed from your cart."
        return handler

    def _place_order(self, values):
        if not self.s.cart:
            return url(HOST, "/checkout/cart"), "Your cart is empty."
        order = self.s.place_order(SHOPPER, list(self.s.cart.items()))
        self.s.cart.clear()
        return url(HOST, "/checkout/onepage/success", order=order.number), ""


def tasks(world: dict, rng: random.Random, n: int) -> list[Task]:
    s: Store = world["store"]
    home, out = url(HOST), []
    mine = [o for o in s.orders if o.customer == SHOPPER]
    last = max(o.number for o in s.orders)
    for p in rng.sample(s.products, n):
        out.append(Task("shopping", "info", "price", f"What is the price of {p.name}?", home,
                        answers=(money(p.price),), params={"product": p.name}))
    for o in rng.sample(mine, min(n, len(mine))):
        out.append(Task("shopping", "info", "order_total", f"What was the order total of my order #{o.number}?",
                        home, answers=(money(o.total),), params={"order": o.number}))
    for c in CATEGORIES:
        cheapest = min((p for p in s.products if p.category == c), key=lambda p: p.price)
        out.append(Task("shopping", "info", "cheapest", f"What is the cheapest product in the {c} category?",
                        home, answers=(cheapest.name,), params={"category": c}))
    for p in rng.sample(s.products, n):
        q = p.name.split(" ", 1)[1].lower()
        out.append(Task("shopping", "nav", "search", f"Show me the search results for '{q}' in the store.", home,
                        url=url(HOST, "/catalogsearch/result", q=q), params={"query": q}))
    for p in rng.sample(s.products, n):
        out.append(Task("shopping", "nav", "product_page", f"Open the product page of {p.name}.", home,
                        url=url(HOST, f"/{slug(p.name)}.html"), params={"product": p.name}))
    for p in rng.sample([p for p in s.products if p.id not in s.wishlist], n):
        out.append(Task("shopping", "state", "wish_add", f"Add {p.name} to my wish list.", home,
                        check=lambda w, pid=p.id: pid in w["store"].wishlist, params={"product": p.name}))
    for pid in s.wishlist:
        name = s.product(pid).name
        out.append(Task("shopping", "state", "wish_remove", f"Remove {name} from my wish list.", home,
                        check=lambda w, pid=pid: pid not in w["store"].wishlist, params={"product": name}))
    for p in rng.sample(s.products, n):
        qty = rng.randint(1, 4)
        check = lambda w, pid=p.id, qty=qty: any(  # noqa: E731
            o.number > last and o.customer == SHOPPER and (pid, qty) in o.items for o in w["store"].orders)
        out.append(Task("shopping", "state", "buy", f"Buy {qty} of {p.name} (place the order).", home,
                        check=check, params={"product": p.name, "qty": qty}))
    return out
