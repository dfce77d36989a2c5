"""Numbers read from text the way Triton's C++ reads them (std::stoi, std::stol), and the
model version of a request, which Triton reads with std::stol."""

from __future__ import annotations

from protos.status import invalid_arg

_SPACE = " \t\n\v\f\r"


def c_stoi(text: str, bits: int = 32) -> int:
    """std::stoi (bits=32) or std::stol (bits=64): leading white space, a sign and decimal
    digits, the rest of the text ignored. ValueError where it finds no number,
    OverflowError past the type's range."""
    body = text.lstrip(_SPACE)
    sign = body[:1] if body[:1] in ("+", "-") else ""
    end = len(sign)
    while end < len(body) and "0" <= body[end] <= "9":
        end += 1
    if end == len(sign):
        raise ValueError(text)
    number = int(body[:end])
    if not -(2 ** (bits - 1)) <= number < 2 ** (bits - 1):
        raise OverflowError(text)
    return number


def parse_version(text: str) -> int:
    """A request's model version as Triton reads it: "" is -1 (the newest ready version);
    otherwise std::stol of it ("2abc" is 2), refused in Triton's words when that finds no
    number or a negative one."""
    if not text:
        return -1
    try:
        version = c_stoi(text, 64)
    except (ValueError, OverflowError):
        raise invalid_arg(
            f"failed to get model version from specified version string '{text}' (details: stol), "
            "version should be an integral value > 0"
        ) from None
    if version < 0:
        raise invalid_arg(f"invalid model version specified '{text}' , version should be an integral value > 0")
    return version
