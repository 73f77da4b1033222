"""Tensors of the Open Inference Protocol (KServe v2, Triton's HTTP API): reading a request, writing a response.

A request is one JSON object, or, with the binary tensor data extension (what Triton's client sends by
default), a JSON header of `Inference-Header-Content-Length` bytes followed by each binary input's bytes
in order, each input saying its size in `parameters.binary_data_size`. Binary data is little-endian and
row-major; a BYTES element is a 4-byte length and its bytes. JSON data may be flat or nested as the
shape. A response writes each output as JSON `data`, or, when asked, as bytes after its JSON header.

This module knows the wire format only; which tensors a model takes, and their limits, are the
endpoint's (`inference_protocol.py`), which checks names, datatypes and shapes before any data is decoded.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Response

from hotrod.serve import unicode_text
from hotrod.serve.http_errors import ApiError

NUMPY_TYPES = {"INT64": np.dtype("<i8"), "FP32": np.dtype("<f4")}  # the fixed-size datatypes hotrod speaks
HEADER = "Inference-Header-Content-Length"
_BYTES_LENGTH = struct.Struct("<I")
_REQUEST_KEYS = {"id", "parameters", "inputs", "outputs"}
_INPUT_KEYS = {"name", "shape", "datatype", "parameters", "data"}


def bad(message: str) -> ApiError:
    return ApiError(400, message)


@dataclass
class Input:
    """One input tensor as sent: its JSON `data`, or its binary bytes (`raw`); not yet decoded."""

    name: str
    datatype: str
    shape: list[int]
    data: Any = None
    raw: bytes | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class InferRequest:
    id: str | None
    parameters: dict[str, Any]
    inputs: list[Input]
    outputs: list[dict[str, Any]] | None  # the requested outputs as sent; None: every output


@dataclass
class Output:
    name: str
    datatype: str  # BYTES (values: strings), INT64 or FP32 (values: anything numpy takes)
    shape: list[int]
    values: Any
    binary: bool = False


# -- reading --------------------------------------------------------------------------------------------

def read_request(body: bytes, header_length: str | None) -> InferRequest:
    """The request's JSON header and inputs, each binary input given its slice of the body."""
    if header_length is None:
        head, rest = body, b""
    else:
        digits = header_length.strip()
        # ASCII digits only, and few: str.isdigit takes "²", and int() refuses more than 4300 digits
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 20 and 0 < int(digits) <= len(body)):
            raise bad(f"{HEADER}: {header_length!r} is not a length within the body's {len(body)} bytes")
        head, rest = body[:int(header_length)], body[int(header_length):]
    request = _json_object(head)
    # a JSON body's strings were checked at the door (`hotrod.serve.gate`); the binary form's header is here
    where = None if header_length is None else unicode_text.lone_surrogate(head, request)
    if where is not None:
        raise bad(unicode_text.refusal(where))
    unknown = sorted(set(request) - _REQUEST_KEYS)
    if unknown:
        raise bad(f"{unknown[0]}: not a field of an inference request (fields: id, parameters, inputs, outputs)")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise bad("inputs: a non-empty list of input tensors is required")
    parsed = [_input(item, f"inputs[{i}]") for i, item in enumerate(inputs)]
    _slice_binary(parsed, inputs, rest, header_length is not None)
    request_id, outputs = request.get("id"), request.get("outputs")
    if request_id is not None and not isinstance(request_id, str):
        raise bad("id: must be a string")
    if outputs is not None and not (isinstance(outputs, list) and all(isinstance(o, dict) for o in outputs)):
        raise bad("outputs: must be a list of objects, each naming an output")
    return InferRequest(request_id, parameters(request, "parameters"), parsed, outputs)


def _json_object(head: bytes) -> dict[str, Any]:
    try:
        value = json.loads(head)
    except (ValueError, RecursionError) as exc:
        raise bad(f"the request is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise bad("the request must be a JSON object")
    return value


def parameters(holder: dict[str, Any], where: str) -> dict[str, Any]:
    value = holder.get("parameters", {})
    if not isinstance(value, dict):
        raise bad(f"{where}: must be an object")
    return value


def _input(item: Any, where: str) -> Input:
    if not isinstance(item, dict):
        raise bad(f"{where}: must be an object with name, shape, datatype and data")
    unknown = sorted(set(item) - _INPUT_KEYS)
    if unknown:
        raise bad(f"{where}.{unknown[0]}: not a field of an input tensor")
    name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
    if not isinstance(name, str) or not isinstance(datatype, str):
        raise bad(f"{where}: name and datatype must be strings")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise bad(f"{name}: shape must be a list of non-negative integers, got {shape!r}")
    return Input(name, datatype, shape, item.get("data"))


def _slice_binary(parsed: list[Input], inputs: list[dict[str, Any]], rest: bytes, has_header: bool) -> None:
    """Give each binary input its bytes; the sizes must account for the body exactly."""
    offset = 0
    for tensor, item in zip(parsed, inputs):
        options = parameters(item, f"{tensor.name}.parameters")
        unknown = sorted(set(options) - {"binary_data_size"})
        if unknown:
            raise bad(f"{tensor.name}.parameters.{unknown[0]}: not supported (only binary_data_size is)")
        size = options.get("binary_data_size")
        if size is None:
            if tensor.data is None:
                raise bad(f"{tensor.name}: no data (give `data`, or binary data with binary_data_size)")
            continue
        if type(size) is not int or size < 0:
            raise bad(f"{tensor.name}.parameters.binary_data_size: must be a non-negative integer")
        if not has_header:
            raise bad(f"{tensor.name}: binary data needs the {HEADER} header")
        if tensor.data is not None:
            raise bad(f"{tensor.name}: give either data or binary_data_size, not both")
        if offset + size > len(rest):
            raise bad(f"{tensor.name}: binary_data_size {size} runs past the end of the body")
        tensor.raw, offset = rest[offset:offset + size], offset + size
    if offset != len(rest):
        raise bad(f"the body has {len(rest)} bytes after its JSON header; the inputs' binary_data_size "
                  f"account for {offset}")


def values(tensor: Input) -> list[Any]:
    """The tensor's elements, flat and row-major: strings for BYTES, integers for INT64."""
    if tensor.raw is not None:
        return _binary_values(tensor)
    found = _flatten(tensor.data, tensor.shape, tensor.name)
    check = _is_int if tensor.datatype == "INT64" else _is_str
    wrong = next((v for v in found if not check(v)), None)
    if wrong is not None:
        raise bad(f"{tensor.name}: element {wrong!r} is not of datatype {tensor.datatype}")
    return found


def _is_int(value: Any) -> bool:
    return type(value) is int and -2**63 <= value < 2**63


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _flatten(data: Any, shape: list[int], name: str) -> list[Any]:
    """Flat data of `shape`'s size, or lists nested exactly as `shape`, as one flat list."""
    if not isinstance(data, list):
        raise bad(f"{name}: data must be a list")
    if not any(isinstance(item, list) for item in data):
        if len(data) != math.prod(shape):
            raise bad(f"{name}: {len(data)} elements for shape {shape} ({math.prod(shape)} elements)")
        return data
    return _nested(data, shape, name)


def _nested(data: Any, shape: list[int], name: str) -> list[Any]:
    if not shape or not isinstance(data, list) or len(data) != shape[0]:
        raise bad(f"{name}: the nested data does not match shape {shape}")
    if len(shape) == 1:
        if any(isinstance(item, list) for item in data):
            raise bad(f"{name}: the data is nested deeper than shape {shape}")
        return data
    return [value for item in data for value in _nested(item, shape[1:], name)]


def _binary_values(tensor: Input) -> list[Any]:
    raw = tensor.raw or b""
    if tensor.datatype == "BYTES":
        return [_text(item, tensor.name, i) for i, item in enumerate(_bytes_elements(raw, tensor))]
    dtype = NUMPY_TYPES[tensor.datatype]
    if len(raw) != tensor.size * dtype.itemsize:
        raise bad(f"{tensor.name}: {len(raw)} bytes of binary data for shape {tensor.shape} of "
                  f"{tensor.datatype} ({tensor.size * dtype.itemsize} bytes)")
    return np.frombuffer(raw, dtype=dtype).tolist()


def _bytes_elements(raw: bytes, tensor: Input) -> list[bytes]:
    """BYTES elements: each a 4-byte little-endian length and that many bytes; as many as the shape says."""
    items, offset = [], 0
    while offset < len(raw) and len(items) < tensor.size:
        if offset + 4 > len(raw):
            break
        (length,) = _BYTES_LENGTH.unpack_from(raw, offset)
        items.append(raw[offset + 4:offset + 4 + length])
        offset += 4 + length
    if offset != len(raw) or len(items) != tensor.size:
        raise bad(f"{tensor.name}: the binary data is not {tensor.size} BYTES elements (a 4-byte length and "
                  f"that many bytes each) for shape {tensor.shape}")
    return items


def _text(item: bytes, name: str, index: int) -> str:
    try:
        return item.decode("utf-8")
    except UnicodeDecodeError:
        raise bad(f"{name}[{index}]: not UTF-8 text") from None


# -- writing --------------------------------------------------------------------------------------------

def response(head: dict[str, Any], outputs: list[Output]) -> Response:
    """The response: all JSON, or its JSON header then the binary outputs' bytes in order."""
    described, blobs = [], []
    for output in outputs:
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": output.shape}
        if output.binary:
            blob = _to_bytes(output)
            blobs.append(blob)
            entry["parameters"] = {"binary_data_size": len(blob)}
        else:
            entry["data"] = _to_json(output)
        described.append(entry)
    header = json.dumps({**head, "outputs": described}, separators=(",", ":")).encode()
    if not blobs:
        return Response(header, media_type="application/json")
    return Response(header + b"".join(blobs), media_type="application/octet-stream",
                    headers={HEADER: str(len(header))})


def _to_bytes(output: Output) -> bytes:
    if output.datatype == "BYTES":
        encoded = [value.encode("utf-8") for value in output.values]
        return b"".join(_BYTES_LENGTH.pack(len(item)) + item for item in encoded)
    return np.ascontiguousarray(output.values, dtype=NUMPY_TYPES[output.datatype]).tobytes()


def _to_json(output: Output) -> list[Any]:
    if output.datatype == "BYTES":
        return list(output.values)
    return np.asarray(output.values, dtype=NUMPY_TYPES[output.datatype]).ravel().tolist()
