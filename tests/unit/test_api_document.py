"""What the API's document says of its errors is what it sends: every refusal is an
`ErrorBody` (`{"detail": …}`), a request that fails validation FastAPI's `HTTPValidationError`.
Schemathesis found the 409 of the one-order actions documented as an `ActionResult`
(`tests/system/test_api_schema.py`, seed 1, once the `/ops` answers had models)."""

from __future__ import annotations

import json

from services.api.app import openapi_document

ERROR_BODY = {"$ref": "#/components/schemas/ErrorBody"}
VALIDATION = {"$ref": "#/components/schemas/HTTPValidationError"}


def test_every_error_answer_is_documented_as_an_error_body() -> None:
    document = json.loads(openapi_document())
    errors = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for code, response in operation["responses"].items():
                if code[0] not in "45":
                    continue
                errors += 1
                schema = response["content"]["application/json"]["schema"]
                wanted = VALIDATION if code == "422" else ERROR_BODY
                assert schema == wanted, f"{method.upper()} {path} {code}: {schema}"
    assert errors > 100
