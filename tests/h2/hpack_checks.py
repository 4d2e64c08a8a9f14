"""HPACK (RFC 7541): every representation decoded right (h2spec's generic 5),
and the errors: §2.3.3 index address space, §4.2 maximum table size, §5.2 string
literals (Huffman padding, EOS), §6.1 index 0, §6.3 table size updates; the
dynamic table bounded by SETTINGS_HEADER_TABLE_SIZE."""

from hpack.hpack import encode_integer
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

from h2conf import *  # noqa: F401,F403
from h2conf import check, frame

HUFFMAN = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)


def integer(value, prefix, first=0):
    out = encode_integer(value, prefix)
    out[0] |= first
    return bytes(out)


def string(s, huffman=False):
    s = s.encode() if isinstance(s, str) else s
    if huffman:
        s = HUFFMAN.encode(s)
        return integer(len(s), 7, 0x80) + s
    return integer(len(s), 7) + s


def huffman_raw(data):
    """A string literal whose Huffman octets are `data` as given."""
    return integer(len(data), 7, 0x80) + data


# Static table indexes (RFC 7541 Appendix A).
METHOD_GET, SCHEME_HTTP, PATH_ROOT, AUTHORITY = 2, 6, 4, 1


def request_prefix():
    """:method GET, :scheme http, :path /, indexed; :authority a literal without indexing."""
    return (
        integer(METHOD_GET, 7, 0x80)
        + integer(SCHEME_HTTP, 7, 0x80)
        + integer(PATH_ROOT, 7, 0x80)
        + integer(AUTHORITY, 4)
        + string("localhost")
    )


def served(ctx, block, what):
    c = ctx.conn()
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, block))
    r = c.response(1)
    if r.status != 200:
        raise Failed("expected :status 200 for %s, saw %s (reset %s)" % (what, r.headers, r.reset))
    return c


def rejected(ctx, block):
    c = ctx.conn()
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, block))
    c.expect_connection_error(COMPRESSION_ERROR)


# -- Representations decoded right (h2spec generic/5) -----------------------------


@check("hpack/1", "Sends an indexed header field representation")
def indexed(ctx):
    served(ctx, request_prefix(), "indexed fields")


@check("hpack/2", "Sends literal header fields with incremental indexing (indexed name, new name), then refers to them")
def incremental(ctx):
    c = ctx.conn()
    block = (
        integer(METHOD_GET, 7, 0x80)
        + integer(SCHEME_HTTP, 7, 0x80)
        + integer(PATH_ROOT, 7, 0x80)
        + integer(AUTHORITY, 6, 0x40)
        + string("localhost")
        + b"\x40"
        + string("x-new-name")
        + string("new-value", huffman=True)
    )
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, block))
    if c.response(1).status != 200:
        raise Failed("expected :status 200 on stream 1, saw %s" % c.responses[1].headers)
    # Dynamic table now: 62 = x-new-name, 63 = :authority localhost.
    block = integer(METHOD_GET, 7, 0x80) + integer(SCHEME_HTTP, 7, 0x80) + integer(PATH_ROOT, 7, 0x80)
    block += integer(63, 7, 0x80) + integer(62, 7, 0x80)
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 3, block))
    r = c.response(3)
    if r.status != 200:
        raise Failed("expected :status 200 from the dynamic table's entries, saw %s" % r.headers)


@check("hpack/3", "Sends literal header fields without indexing and never indexed (indexed and new names)")
def not_indexed(ctx):
    block = request_prefix()
    block += b"\x00" + string("x-plain") + string("v1")
    block += integer(58, 4) + string("agent", huffman=True)  # user-agent, without indexing
    block += b"\x10" + string("x-secret", huffman=True) + string("v2")
    block += integer(32, 4, 0x10) + string("k=v")  # cookie, never indexed
    served(ctx, block, "literals without indexing")


@check("hpack/4", "Sends a dynamic table size update at the start of the block")
def size_update_at_start(ctx):
    served(ctx, integer(0, 5, 0x20) + integer(2048, 5, 0x20) + request_prefix(), "size updates first")


# -- 2.3.3 Index Address Space -------------------------------------------------------


@check("2.3.3/1", "Sends a indexed header field representation with invalid index")
def invalid_index(ctx):
    rejected(ctx, request_prefix() + integer(70, 7, 0x80))


@check("2.3.3/2", "Sends a literal header field representation with invalid index")
def invalid_name_index(ctx):
    rejected(ctx, request_prefix() + integer(70, 6, 0x40) + string("test"))


# -- 4.2 Maximum Table Size ----------------------------------------------------------


@check("4.2/1", "Sends a dynamic table size update at the end of header block")
def size_update_at_end(ctx):
    rejected(ctx, request_prefix() + integer(0, 5, 0x20))


@check("4.2/2", "The dynamic table holds at most SETTINGS_HEADER_TABLE_SIZE: an evicted entry is invalid")
def table_bounded(ctx):
    c = ctx.conn()
    size = c.server_settings.get(HEADER_TABLE_SIZE, 4096)
    # Two entries of 3000 octets each do not fit in 4096: the first is evicted.
    value = "v" * (size * 3 // 4 - 32 - 8)
    block = request_prefix()
    block += b"\x40" + string("x-first") + string(value)
    block += b"\x40" + string("x-second") + string(value)
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, block))
    if c.response(1).status != 200:
        raise Failed("expected :status 200 on stream 1, saw %s" % c.responses[1].headers)
    block = integer(METHOD_GET, 7, 0x80) + integer(SCHEME_HTTP, 7, 0x80) + integer(PATH_ROOT, 7, 0x80)
    block += integer(AUTHORITY, 4) + string("localhost") + integer(63, 7, 0x80)
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 3, block))
    c.expect_connection_error(COMPRESSION_ERROR)


# -- 5.2 String Literal Representation -----------------------------------------------


@check("5.2/1", "Sends a Huffman-encoded string literal representation with padding longer than 7 bits")
def huffman_long_padding(ctx):
    rejected(ctx, request_prefix() + b"\x00" + huffman_raw(HUFFMAN.encode(b"x-test") + b"\xff") + string("ok"))


@check("5.2/2", "Sends a Huffman-encoded string literal representation padded by zero")
def huffman_zero_padding(ctx):
    name = b"x-test"
    bits = sum(REQUEST_CODES_LENGTH[b] for b in name)
    pad = 8 * ((bits + 7) // 8) - bits
    if pad == 0:
        raise Failed("the check's name needs padding")
    octets = bytearray(HUFFMAN.encode(name))
    octets[-1] &= ~((1 << pad) - 1) & 0xFF
    rejected(ctx, request_prefix() + b"\x00" + huffman_raw(bytes(octets)) + string("ok"))


@check("5.2/3", "Sends a Huffman-encoded string literal representation containing the EOS symbol")
def huffman_eos(ctx):
    rejected(ctx, request_prefix() + b"\x00" + huffman_raw(b"\xff\xff\xff\xff") + string("ok"))


# -- 6.1 Indexed Header Field Representation -----------------------------------------


@check("6.1/1", "Sends a indexed header field representation with index 0")
def index_zero(ctx):
    rejected(ctx, request_prefix() + b"\x80")


# -- 6.3 Dynamic Table Size Update ---------------------------------------------------


@check("6.3/1", "Sends a dynamic table size update larger than the value of SETTINGS_HEADER_TABLE_SIZE")
def size_update_too_large(ctx):
    c = ctx.conn()
    size = c.server_settings.get(HEADER_TABLE_SIZE, 4096)
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, integer(size + 1, 5, 0x20) + request_prefix()))
    c.expect_connection_error(COMPRESSION_ERROR)
