"""The HTTP ceiling: a minimal Starlette app that answers POST with 204.

Run under the same uvicorn settings as our server (uvloop, httptools, one
worker, no access log), it is the most any Python server could do here.
"""

from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route


async def ok(request) -> Response:
    await request.body()
    return Response(status_code=204)


app = Starlette(routes=[Route("/{path:path}", ok, methods=["POST", "PUT", "GET"])])
