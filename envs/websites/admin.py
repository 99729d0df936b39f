"""The shop's admin panel and CMS (WebArena's `shopping_admin`, Magento admin), simulated.

It edits the same `Store` as the shop (shop.py). Pages under `http://luma.com/admin`: dashboard,
order grid with keyword search, order view (cancel, add a comment), product grid with search,
product edit form (name, price, quantity, enabled), customer grid, CMS page grid and edit form.
Tasks: customer of an order / SKU / number of orders in a status (info), order page / product edit
page (nav), change a price, cancel an order, comment on an order, retitle a CMS page (state).
"""
from __future__ import annotations

import random

from .page import Node, Task, button, checkbox, group, heading, link, row, text, textbox, url
from .shop import STATUSES, Store, money

HOST = "luma.com"
COMMENTS = ["Customer asked for gift wrapping", "Address confirmed by phone", "Ship with the next pickup",
            "Refund approved by manager", "Delivery delayed by the carrier", "Customer prefers email contact"]


def _header(title: str) -> list[Node]:
    return [group("navigation", "", link("Dashboard", url(HOST, "/admin/dashboard")),
                  link("Orders", url(HOST, "/admin/sales/order")),
                  link("Products", url(HOST, "/admin/catalog/product")),
                  link("Customers", url(HOST, "/admin/customer/index")),
                  link("Pages", url(HOST, "/admin/cms/page"))), heading(title)]


def _grid(path: str, query: dict[str, str], columns: list[str], rows: list[Node]) -> list[Node]:
    search = lambda v: (url(HOST, path, search=v.get("search", "").strip()), "")  # noqa: E731
    return [textbox("Search by keyword", "search", query.get("search", ""), submit=search, role="searchbox"),
            button("Search", search), text(f"{len(rows)} records found"),
            row(*[Node("columnheader", c) for c in columns])] + rows


def _hit(words: str, *fields: str) -> bool:
    hay = " ".join(fields).lower()
    return all(w in hay for w in words.lower().split())


class Admin:
    name, host, title = "shopping_admin", HOST, "Magento Admin"

    def __init__(self, store: Store):
        self.s = store

    def page(self, path: str, query: dict[str, str]) -> tuple[str, list[Node]] | None:
        s, q = self.s, query.get("search", "")
        if path in ("/admin", "/admin/dashboard"):
            recent = [row(o.number, o.customer, money(o.total)) for o in s.orders[::-1][:5]]
            lifetime = sum(o.total for o in s.orders if o.status != "Canceled")
            return "Dashboard / Magento Admin", _header("Dashboard") + [
                text(f"Lifetime Sales: {money(lifetime)}"), heading("Last Orders")] + recent
        if path == "/admin/sales/order":
            rows = [row(o.number, o.date, o.customer, money(o.total), o.status,
                        link("View", url(HOST, f"/admin/sales/order/view/order_id/{o.number}")))
                    for o in s.orders if _hit(q, o.number, o.customer, o.status)]
            return "Orders / Sales / Magento Admin", _header("Orders") + _grid(
                path, query, ["ID", "Purchase Date", "Bill-to Name", "Grand Total", "Status", "Action"], rows)
        if path.startswith("/admin/sales/order/view/order_id/"):
            o = s.order(path.rsplit("/", 1)[1])
            if o is None:
                return None
            items = [row(s.product(i).name, s.product(i).sku, money(s.product(i).price), f"Qty: {n}")
                     for i, n in o.items]
            actions = [button("Cancel", self._cancel(o.number))] if o.status in ("Pending", "Processing") else []
            history = [text(c) for c in o.comments]
            return f"# {o.number} / Orders / Magento Admin", _header(f"# {o.number}") + actions + [
                text(f"Order Status: {o.status}"), text(f"Order Date: {o.date}"), text(f"Customer Name: {o.customer}"),
                heading("Items Ordered")] + items + [
                text(f"Grand Total: {money(o.total)}"), heading("Notes for this Order"),
                textbox("Comment", "comment"), button("Submit Comment", self._comment(o.number))] + history
        if path == "/admin/catalog/product":
            rows = [row(str(p.id), p.name, p.sku, money(p.price), str(p.qty), "Enabled" if p.enabled else "Disabled",
                        link("Edit", url(HOST, f"/admin/catalog/product/edit/id/{p.id}")))
                    for p in s.products if _hit(q, p.name, p.sku)]
            return "Products / Inventory / Catalog / Magento Admin", _header("Products") + _grid(
                path, query, ["ID", "Name", "SKU", "Price", "Quantity", "Status", "Action"], rows)
        if path.startswith("/admin/catalog/product/edit/id/"):
            p = next((p for p in s.products if str(p.id) == path.rsplit("/", 1)[1]), None)
            if p is None:
                return None
            save = self._save_product(p.id)  # Enter in a one-line field submits the form, as in a browser
            return f"{p.name} / Products / Magento Admin", _header(p.name) + [
                button("Save", save), checkbox("Enable Product", "enabled", p.enabled),
                textbox("Product Name", "name", p.name, save, required=True), text(f"SKU: {p.sku}"),
                textbox("Price", "price", f"{p.price:.2f}", save, required=True),
                textbox("Quantity", "qty", str(p.qty), save)]
        if path == "/admin/customer/index":
            rows = [row(str(c.id), c.name, c.email, c.city) for c in s.customers if _hit(q, c.name, c.email)]
            return "Customers / Magento Admin", _header("Customers") + _grid(
                path, query, ["ID", "Name", "Email", "City"], rows)
        if path == "/admin/cms/page":
            rows = [row(p.title, p.key, "Enabled" if p.enabled else "Disabled",
                        link("Edit", url(HOST, f"/admin/cms/page/edit/page_id/{p.id}"))) for p in s.pages]
            return "Pages / Elements / Content / Magento Admin", _header("Pages") + [
                row(*[Node("columnheader", c) for c in ("Title", "URL Key", "Status", "Action")])] + rows
        if path.startswith("/admin/cms/page/edit/page_id/"):
            p = next((p for p in s.pages if str(p.id) == path.rsplit("/", 1)[1]), None)
            if p is None:
                return None
            return f"{p.title} / Pages / Magento Admin", _header(p.title) + [
                button("Save Page", self._save_page(p.id)), checkbox("Enable Page", "enabled", p.enabled),
                textbox("Page Title", "title", p.title, self._save_page(p.id), required=True),
                textbox("Content", "content", p.content)]
        return None

    def _cancel(self, number: str):
        def handler(values):
            order = self.s.order(number)
            order.status = "Canceled"
            return url(HOST, f"/admin/sales/order/view/order_id/{number}"), "You canceled the order."
        return handler

    def _comment(self, number: str):
        def handler(values):
            here = url(HOST, f"/admin/sales/order/view/order_id/{number}")
            comment = values.get("comment", "").strip()
            if not comment:
                return here, "Please enter a comment."
            self.s.order(number).comments.append(comment[:500])
            return here, "You added a comment to the order."
        return handler

    def _save_product(self, pid: int):
        def handler(values):
            here = url(HOST, f"/admin/catalog/product/edit/id/{pid}")
            name, price, qty = (values.get(k, "").strip() for k in ("name", "price", "qty"))
            try:
                price_value = float(price.replace("$", "").replace(",", ""))
            except ValueError:
                return here, "Please enter a valid number in the Price field."
            if not name or not qty.isdigit() or not 0 <= price_value < 1e6:
                return here, "Please fill in a product name, a price and a whole-number quantity."
            p = self.s.product(pid)
            p.name, p.price, p.qty = name[:200], round(price_value, 2), int(qty)
            p.enabled = values.get("enabled") == "true"
            return here, "You saved the product."
        return handler

    def _save_page(self, page_id: int):
        def handler(values):
            here = url(HOST, f"/admin/cms/page/edit/page_id/{page_id}")
            title = values.get("title", "").strip()
            if not title:
                return here, "The Page Title field is required."
            page = next(p for p in self.s.pages if p.id == page_id)
            page.title, page.content = title[:200], values.get("content", "")[:2000]
            page.enabled = values.get("enabled") == "true"
            return here, "You saved the page."
        return handler


def tasks(world: dict, rng: random.Random, n: int) -> list[Task]:
    s: Store = world["store"]
    home, out = url(HOST, "/admin/dashboard"), []
    for o in rng.sample(s.orders, n):
        out.append(Task("shopping_admin", "info", "order_customer", f"Which customer placed order #{o.number}?",
                        home, answers=(o.customer,), params={"order": o.number}))
    for p in rng.sample(s.products, n):
        out.append(Task("shopping_admin", "info", "sku", f"What is the SKU of the product {p.name}?", home,
                        answers=(p.sku,), params={"product": p.name}))
    for status in STATUSES:
        count = sum(o.status == status for o in s.orders)
        out.append(Task("shopping_admin", "info", "count_status", f"How many orders have the status {status}?",
                        home, answers=(str(count),), params={"status": status}))
    for o in rng.sample(s.orders, n):
        out.append(Task("shopping_admin", "nav", "order_page", f"Open the admin page of order #{o.number}.", home,
                        url=url(HOST, f"/admin/sales/order/view/order_id/{o.number}"), params={"order": o.number}))
    for p in rng.sample(s.products, n):
        out.append(Task("shopping_admin", "nav", "product_edit", f"Open the edit page of the product {p.name}.",
                        home, url=url(HOST, f"/admin/catalog/product/edit/id/{p.id}"), params={"product": p.name}))
    for p in rng.sample(s.products, n):
        price = round(p.price + rng.choice([-1, 1]) * rng.randint(1, 5) - 0.01, 2)
        price = price if price > 0 else round(p.price + 3.0, 2)
        out.append(Task("shopping_admin", "state", "set_price", f"Change the price of {p.name} to {money(price)}.",
                        home, check=lambda w, pid=p.id, price=price: abs(w["store"].product(pid).price - price) < 0.005,
                        params={"product": p.name, "price": f"{price:.2f}"}))
    open_orders = [o for o in s.orders if o.status in ("Pending", "Processing")]
    for o in rng.sample(open_orders, min(n, len(open_orders))):
        out.append(Task("shopping_admin", "state", "cancel", f"Cancel order #{o.number}.", home,
                        check=lambda w, num=o.number: w["store"].order(num).status == "Canceled",
                        params={"order": o.number}))
    for o in rng.sample(s.orders, n):
        c = rng.choice(COMMENTS)
        out.append(Task("shopping_admin", "state", "comment", f"Add the comment '{c}' to order #{o.number}.", home,
                        check=lambda w, num=o.number, c=c: c.lower() in [x.lower() for x in w["store"].order(num).comments],
                        params={"order": o.number, "comment": c}))
    for page in s.pages:
        new = f"{page.title} at One Stop Market"
        check = lambda w, pid=page.id, new=new: next(p for p in w["store"].pages if p.id == pid).title == new  # noqa: E731
        out.append(Task("shopping_admin", "state", "cms_title", f"Change the title of the CMS page '{page.title}' "
                        f"to '{new}'.", home, check=check, params={"page": page.title, "title": new}))
    return out
