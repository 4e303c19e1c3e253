"""The shop and the operator console: static pages the API serves, which call its endpoints
from the browser with the token the user gives them (kept in the browser's session storage).

No front-end build: plain HTML, one stylesheet and a little JavaScript each."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, HTTPException
from fastapi.responses import HTMLResponse, Response

router = APIRouter(include_in_schema=False)

STATIC = resources.files("services.api") / "static"
TYPES = {".css": "text/css", ".js": "text/javascript", ".html": "text/html"}
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    # Only this origin's scripts, styles and endpoints: no inline script, nothing third-party;
    # no <base> to move relative URLs elsewhere, forms sent nowhere else, and no framing.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}


def _page(name: str) -> HTMLResponse:
    return HTMLResponse((STATIC / name).read_text(encoding="utf-8"), headers=HEADERS)


@router.get("/")
async def shop_page() -> HTMLResponse:
    return _page("shop.html")


@router.get("/console")
async def console_page() -> HTMLResponse:
    return _page("console.html")


@router.get("/static/{name}")
async def static_file(name: str) -> Response:
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or name.startswith(".") or suffix not in TYPES:
        raise HTTPException(404, "no such file")
    item = STATIC / name
    if not item.is_file():
        raise HTTPException(404, "no such file")
    return Response(item.read_bytes(), media_type=TYPES[suffix], headers=HEADERS)
