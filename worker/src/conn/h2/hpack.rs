//! HPACK (RFC 7541): the header blocks of one HTTP/2 connection, decoded into
//! [`Fields`] and written by [`status`] and [`field`].
//!
//! Decoding is ours: integers, strings (Huffman-coded ones by `huffman.rs`), the
//! static table and the peer's dynamic table, bounded by our
//! `SETTINGS_HEADER_TABLE_SIZE` ([`TABLE_SIZE`]). Each field is copied once into
//! the block's one buffer, and only while the list stays within the bound the
//! caller gives: a block that references a large table entry thousands of times (a
//! "bomb") costs that bound in memory, never its decoded size, yet is decoded to
//! its end so the dynamic table stays in step with the peer's encoder. (The
//! `loona-hpack` crate did this first; its Huffman decoder builds a hash map per
//! string, which made a request whose fields are Huffman-coded cost ten times one
//! whose fields are indexed.)
//!
//! Encoding is ours and uses no dynamic table (nginx's choice): every field is a
//! literal naming the static table's entry when there is one, no Huffman. It costs
//! a few bytes per response against an indexing encoder and no CPU or memory to keep
//! a table; the connection sends [`SIZE_UPDATE_ZERO`] first to tell the peer's
//! decoder it may drop its own.

use super::huffman;
use std::collections::VecDeque;
use std::fmt;

/// The dynamic table size we announce (`SETTINGS_HEADER_TABLE_SIZE`, the default
/// of RFC 9113 §6.5.2): a size update above it is an error.
pub const TABLE_SIZE: usize = 4096;

/// Each field's overhead in a header list's size (RFC 9113 §6.5.2).
const FIELD_OVERHEAD: usize = 32;

/// The decoded fields of one header block, in order: their bytes in one buffer
/// (kept across blocks: [`Fields::clear`] keeps the capacity).
#[derive(Debug, Default)]
pub struct Fields {
    bytes: Vec<u8>,
    spans: Vec<Span>,
    list_size: usize,
    over: bool,
}

/// Where one field's name and value lie in [`Fields::bytes`]: the name at
/// `start..start + name`, the value right after it.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    name: usize,
    value: usize,
}

impl Fields {
    pub fn new() -> Fields {
        Fields::default()
    }

    /// Empties the list, keeping its buffers for the next block.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
        self.list_size = 0;
        self.over = false;
    }

    /// Each field kept, as (name, value), in the block's order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.spans.iter().map(|s| {
            let name = &self.bytes[s.start..s.start + s.name];
            let value = &self.bytes[s.start + s.name..s.start + s.name + s.value];
            (name, value)
        })
    }

    /// Fields kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// The size of the whole list the block carried, kept or not (RFC 9113 §6.5.2:
    /// name + value + 32 per field), saturating.
    #[cfg(test)]
    pub fn list_size(&self) -> usize {
        self.list_size
    }

    /// The list passed the bound given to [`Decoder::decode`]: the fields from the
    /// one that passed it on were not kept.
    pub fn over(&self) -> bool {
        self.over
    }

    /// Adds a field if the list with it stays within `max_list`.
    fn push(&mut self, name: &[u8], value: &[u8], max_list: usize) {
        let size = name.len() + value.len() + FIELD_OVERHEAD;
        self.list_size = self.list_size.saturating_add(size);
        if self.over || self.list_size > max_list {
            self.over = true;
            return;
        }
        let start = self.bytes.len();
        self.bytes.extend_from_slice(name);
        self.bytes.extend_from_slice(value);
        self.spans.push(Span {
            start,
            name: name.len(),
            value: value.len(),
        });
    }
}

/// A header block that cannot be decoded: the connection's HPACK state is lost,
/// answered with GOAWAY(COMPRESSION_ERROR) (RFC 9113 §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// An integer cut short by the block's end, or too large.
    Integer,
    /// A string longer than what is left of the block.
    String,
    /// A Huffman-coded string with bad padding or EOS in it.
    Huffman(huffman::Bad),
    /// An index of no entry (0, or past the dynamic table).
    Index(usize),
    /// A dynamic table size update above [`TABLE_SIZE`].
    TableSize(usize),
    /// A dynamic table size update after a field (RFC 7541 §4.2: only at the
    /// start of a block).
    SizeUpdateAfterField,
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::Integer => f.write_str("HPACK: an integer cut short or too large"),
            Compression::String => f.write_str("HPACK: a string past the block"),
            Compression::Huffman(b) => write!(f, "HPACK: a bad Huffman string ({b:?})"),
            Compression::Index(i) => write!(f, "HPACK: index {i} names no entry"),
            Compression::TableSize(n) => {
                write!(f, "HPACK: a table size update to {n}, above {TABLE_SIZE}")
            }
            Compression::SizeUpdateAfterField => {
                f.write_str("HPACK: dynamic table size update after a field")
            }
        }
    }
}

/// One entry of the peer's dynamic table: name and value in one allocation.
#[derive(Debug)]
struct Entry {
    bytes: Box<[u8]>,
    name: usize,
}

impl Entry {
    fn size(&self) -> usize {
        self.bytes.len() + FIELD_OVERHEAD
    }
}

/// The connection's decoding state: the peer's dynamic table, newest first.
#[derive(Debug, Default)]
pub struct Decoder {
    table: VecDeque<Entry>,
    /// Its size (RFC 7541 §4.1) and the bound the peer's last size update set.
    size: usize,
    max: usize,
    /// The bound a size update may not pass (our SETTINGS).
    allowed: usize,
    /// A literal's name and value as decoded (Huffman), reused.
    name: Vec<u8>,
    value: Vec<u8>,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder {
            max: TABLE_SIZE,
            allowed: TABLE_SIZE,
            ..Decoder::default()
        }
    }

    /// Decodes one whole header block (HEADERS and its CONTINUATIONs) into `into`
    /// (cleared first), keeping fields while the list's size stays within
    /// `max_list` (our `SETTINGS_MAX_HEADER_LIST_SIZE`): see [`Fields::over`]. After
    /// an error `into` holds the fields before it, of no use: the connection ends.
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list: usize,
        into: &mut Fields,
    ) -> Result<(), Compression> {
        into.clear();
        let mut at = 0;
        let mut fields = false;
        while at < block.len() {
            let first = block[at];
            if first & 0x80 != 0 {
                let index = take_integer(block, &mut at, 7)?;
                let (name, value) = self.entry(index)?;
                into.push(name, value, max_list);
                fields = true;
            } else if first & 0x40 != 0 {
                self.literal(block, &mut at, 6)?;
                into.push(&self.name, &self.value, max_list);
                self.insert();
                fields = true;
            } else if first & 0x20 != 0 {
                if fields {
                    return Err(Compression::SizeUpdateAfterField);
                }
                let size = take_integer(block, &mut at, 5)?;
                if size > self.allowed {
                    return Err(Compression::TableSize(size));
                }
                self.max = size;
                self.evict(0);
            } else {
                // Without indexing, or never indexed (4-bit prefix both).
                self.literal(block, &mut at, 4)?;
                into.push(&self.name, &self.value, max_list);
                fields = true;
            }
        }
        Ok(())
    }

    /// The name and value of entry `index` (static, then dynamic: RFC 7541 §2.3.3).
    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), Compression> {
        match index {
            0 => Err(Compression::Index(0)),
            1..=61 => Ok((STATIC_NAMES[index - 1], STATIC_VALUES[index - 1])),
            _ => self
                .table
                .get(index - 62)
                .map(|e| (&e.bytes[..e.name], &e.bytes[e.name..]))
                .ok_or(Compression::Index(index)),
        }
    }

    /// A literal's name (indexed or a string) and value into `self.name` and
    /// `self.value`.
    fn literal(&mut self, block: &[u8], at: &mut usize, prefix: u8) -> Result<(), Compression> {
        let index = take_integer(block, at, prefix)?;
        let mut name = std::mem::take(&mut self.name);
        name.clear();
        if index == 0 {
            take_string(block, at, &mut name)?;
        } else {
            name.extend_from_slice(self.entry(index)?.0);
        }
        self.name = name;
        self.value.clear();
        take_string(block, at, &mut self.value)
    }

    /// Adds the literal just decoded to the dynamic table (RFC 7541 §4.4).
    fn insert(&mut self) {
        let entry = Entry {
            bytes: [&self.name[..], &self.value[..]]
                .concat()
                .into_boxed_slice(),
            name: self.name.len(),
        };
        let size = entry.size();
        self.evict(size);
        if size <= self.max {
            self.size += size;
            self.table.push_front(entry);
        }
    }

    /// Evicts the oldest entries until `room` more fits within the bound.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            match self.table.pop_back() {
                Some(e) => self.size -= e.size(),
                None => break,
            }
        }
    }

    /// The table size our SETTINGS announced, for tests that decode blocks written
    /// for another (RFC 7541 C.5 and C.6 assume 256).
    #[cfg(test)]
    fn set_table_size(&mut self, size: usize) {
        self.allowed = size;
        self.max = size;
        self.evict(0);
    }
}

/// An integer from `block[*at..]`, moving `at` past it.
fn take_integer(block: &[u8], at: &mut usize, prefix: u8) -> Result<usize, Compression> {
    let (value, n) = integer(&block[*at..], prefix).ok_or(Compression::Integer)?;
    *at += n;
    Ok(value)
}

/// A string literal (RFC 7541 §5.2) from `block[*at..]` appended to `out`.
fn take_string(block: &[u8], at: &mut usize, out: &mut Vec<u8>) -> Result<(), Compression> {
    let huffman = block.get(*at).ok_or(Compression::String)? & 0x80 != 0;
    let len = take_integer(block, at, 7)?;
    let end = at.checked_add(len).filter(|&e| e <= block.len());
    let end = end.ok_or(Compression::String)?;
    let raw = &block[*at..end];
    *at = end;
    if huffman {
        huffman::decode(raw, out).map_err(Compression::Huffman)
    } else {
        out.extend_from_slice(raw);
        Ok(())
    }
}

/// An HPACK integer with an N-bit prefix (RFC 7541 §5.1) from the front of `buf`
/// and the bytes it took; `None` if cut short or too large to matter.
fn integer(buf: &[u8], prefix: u8) -> Option<(usize, usize)> {
    let mask = (1u16 << prefix) as u8 - 1;
    let first = *buf.first()? & mask;
    if first < mask {
        return Some((first as usize, 1));
    }
    let mut value = mask as usize;
    for (i, &b) in buf[1..].iter().enumerate().take(5) {
        value += ((b & 0x7f) as usize) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 2));
        }
    }
    None
}

/// A dynamic table size update to 0 (RFC 7541 §6.3): the start of the first block
/// the connection sends, since we never index.
pub const SIZE_UPDATE_ZERO: &[u8] = &[0x20];

/// The static table's `:status` entries (RFC 7541 Appendix A, 8 to 14).
const STATUSES: [(u16, u8); 7] = [
    (200, 8),
    (204, 9),
    (206, 10),
    (304, 11),
    (400, 12),
    (404, 13),
    (500, 14),
];

/// The static table's index of `:status` (its first entry).
const STATUS_NAME: usize = 8;

/// Writes `:status code`: indexed for the seven statuses the static table holds,
/// else a literal naming its `:status` entry.
pub fn status(out: &mut Vec<u8>, code: u16) {
    if let Some(&(_, index)) = STATUSES.iter().find(|&&(c, _)| c == code) {
        out.push(0x80 | index);
        return;
    }
    let mut digits = [0u8; 5];
    let mut at = digits.len();
    let mut n = code;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    put_integer(out, 0x00, 4, STATUS_NAME);
    put_string(out, &digits[at..], false);
}

/// Writes one field as a literal without indexing, or never indexed for the
/// fields that carry credentials (RFC 7541 §7.1.3: an intermediary must not
/// index them either). The name is written lowercased and refers to the static
/// table's entry when it names one.
pub fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    let sensitive = match name.len() {
        10 => same_name(b"set-cookie", name),
        13 => same_name(b"authorization", name),
        19 => same_name(b"proxy-authorization", name),
        _ => false,
    };
    let kind = if sensitive { 0x10 } else { 0x00 };
    match static_name(name) {
        // The common case in one write: a static name index from 15 to 142 (two
        // octets with the 4-bit prefix) and a value shorter than 127 (one octet).
        Some(index) if (15..143).contains(&index) && value.len() < 127 => {
            out.extend_from_slice(&[kind | 0x0f, (index - 15) as u8, value.len() as u8]);
            out.extend_from_slice(value);
            return;
        }
        Some(index) => put_integer(out, kind, 4, index),
        None => {
            out.push(kind);
            put_string(out, name, true);
        }
    }
    put_string(out, value, false);
}

/// Whether field name `name` (a token, any case) is `lower` (lowercase letters,
/// digits, `-`, `:`). Eight bytes at a time: OR-ing 0x20 into a byte lowercases an
/// ASCII letter and leaves digits, `-` and `:` as they are; the only other bytes it
/// maps onto those are control bytes, which no token has.
fn same_name(lower: &[u8], name: &[u8]) -> bool {
    if lower.len() != name.len() {
        return false;
    }
    const CASE: u64 = 0x2020_2020_2020_2020;
    let mut a = lower.chunks_exact(8);
    let mut b = name.chunks_exact(8);
    for (x, y) in (&mut a).zip(&mut b) {
        let x = u64::from_le_bytes(x.try_into().expect("8 bytes"));
        let y = u64::from_le_bytes(y.try_into().expect("8 bytes"));
        if x != y | CASE {
            return false;
        }
    }
    a.remainder()
        .iter()
        .zip(b.remainder())
        .all(|(&x, &y)| x == y | 0x20)
}

/// The names of the static table (RFC 7541 Appendix A), by index from 1.
const STATIC_NAMES: [&[u8]; 61] = [
    b":authority",
    b":method",
    b":method",
    b":path",
    b":path",
    b":scheme",
    b":scheme",
    b":status",
    b":status",
    b":status",
    b":status",
    b":status",
    b":status",
    b":status",
    b"accept-charset",
    b"accept-encoding",
    b"accept-language",
    b"accept-ranges",
    b"accept",
    b"access-control-allow-origin",
    b"age",
    b"allow",
    b"authorization",
    b"cache-control",
    b"content-disposition",
    b"content-encoding",
    b"content-language",
    b"content-length",
    b"content-location",
    b"content-range",
    b"content-type",
    b"cookie",
    b"date",
    b"etag",
    b"expect",
    b"expires",
    b"from",
    b"host",
    b"if-match",
    b"if-modified-since",
    b"if-none-match",
    b"if-range",
    b"if-unmodified-since",
    b"last-modified",
    b"link",
    b"location",
    b"max-forwards",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"range",
    b"referer",
    b"refresh",
    b"retry-after",
    b"server",
    b"set-cookie",
    b"strict-transport-security",
    b"transfer-encoding",
    b"user-agent",
    b"vary",
    b"via",
    b"www-authenticate",
];

/// The static table's first index for `name`, compared without case.
/// The values of the static table (RFC 7541 Appendix A), by index from 1.
const STATIC_VALUES: [&[u8]; 61] = {
    let mut v: [&[u8]; 61] = [b""; 61];
    v[1] = b"GET";
    v[2] = b"POST";
    v[3] = b"/";
    v[4] = b"/index.html";
    v[5] = b"http";
    v[6] = b"https";
    v[7] = b"200";
    v[8] = b"204";
    v[9] = b"206";
    v[10] = b"304";
    v[11] = b"400";
    v[12] = b"404";
    v[13] = b"500";
    v[15] = b"gzip, deflate";
    v
};

/// The static table's index of `name`, compared without case.
fn static_name(name: &[u8]) -> Option<usize> {
    let bucket = BY_LENGTH.get(name.len())?;
    let first = name.first()? | 0x20;
    bucket
        .iter()
        .take_while(|&&i| i != 0)
        .map(|&i| usize::from(i))
        .find(|&i| {
            let candidate = STATIC_NAMES[i - 1];
            // The first byte tells most candidates apart without a whole compare.
            candidate[0] == first && same_name(candidate, name)
        })
}

/// The static table's indices by name length (the first index of a name only; 0
/// ends a bucket), so a name is compared with the few of its length.
const BY_LENGTH: [[u8; 8]; 28] = {
    let mut t = [[0u8; 8]; 28];
    let mut i = 0;
    while i < STATIC_NAMES.len() {
        let name = STATIC_NAMES[i];
        let repeated = i > 0 && STATIC_NAMES[i - 1].len() == name.len() && {
            // The entries of one name are adjacent (`:method` 2 and 3, ...).
            let prev = STATIC_NAMES[i - 1];
            let mut same = true;
            let mut k = 0;
            while k < name.len() {
                if prev[k] != name[k] {
                    same = false;
                }
                k += 1;
            }
            same
        };
        if !repeated {
            let bucket = &mut t[name.len()];
            let mut slot = 0;
            while bucket[slot] != 0 {
                slot += 1;
            }
            bucket[slot] = (i + 1) as u8;
        }
        i += 1;
    }
    t
};

/// Writes `value` as an integer with an N-bit prefix, the bits above it `high`.
fn put_integer(out: &mut Vec<u8>, high: u8, prefix: u8, value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(high | value as u8);
        return;
    }
    out.push(high | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Writes a string literal without Huffman, lowercased if `lower`.
fn put_string(out: &mut Vec<u8>, s: &[u8], lower: bool) {
    put_integer(out, 0x00, 7, s.len());
    if lower {
        out.extend(s.iter().map(u8::to_ascii_lowercase));
    } else {
        out.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::super::fuzz::config;
    use super::*;
    use proptest::prelude::*;

    use super::super::fuzz::hex;

    fn list(f: &Fields) -> Vec<(String, String)> {
        f.iter()
            .map(|(n, v)| {
                (
                    String::from_utf8(n.to_vec()).unwrap(),
                    String::from_utf8(v.to_vec()).unwrap(),
                )
            })
            .collect()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|&(n, v)| (n.into(), v.into())).collect()
    }

    /// Decodes `blocks` in turn on one decoder, checking each list.
    fn story(table: usize, blocks: &[&str], want: &[&[(&str, &str)]]) {
        let mut d = Decoder::new();
        d.set_table_size(table);
        let mut f = Fields::new();
        for (block, want) in blocks.iter().zip(want) {
            d.decode(&hex(block), 1 << 16, &mut f).unwrap();
            assert_eq!(list(&f), pairs(want), "{block}");
            let size: usize = want.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
            assert_eq!(f.list_size(), size);
            assert!(!f.over());
        }
    }

    const REQUESTS: [&[(&str, &str)]; 3] = [
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ],
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ],
        &[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ],
    ];

    const RESPONSES: [&[(&str, &str)]; 3] = [
        &[
            (":status", "302"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
            ("location", "https://www.example.com"),
        ],
        &[
            (":status", "307"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
            ("location", "https://www.example.com"),
        ],
        &[
            (":status", "200"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            ("location", "https://www.example.com"),
            ("content-encoding", "gzip"),
            (
                "set-cookie",
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            ),
        ],
    ];

    /// RFC 7541 C.3 to C.6, as written there (and decoded the same by Python's
    /// `hpack` 4.2).
    const C3: [&str; 3] = [
        "828684410f7777772e6578616d706c652e636f6d",
        "828684be58086e6f2d6361636865",
        "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
    ];
    const C4: [&str; 3] = [
        "828684418cf1e3c2e5f23a6ba0ab90f4ff",
        "828684be5886a8eb10649cbf",
        "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
    ];
    const C5: [&str; 3] = [
        "4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d546e1768747470733a2f2f7777772e6578616d706c652e636f6d",
        "4803333037c1c0bf",
        "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f3d4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b2076657273696f6e3d31",
    ];
    const C6: [&str; 3] = [
        "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f0b97c8e9ae82ae43d3",
        "4883640effc1c0bf",
        "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007",
    ];

    #[test]
    fn rfc7541_c3_requests_without_huffman() {
        story(TABLE_SIZE, &C3, &REQUESTS);
    }

    #[test]
    fn rfc7541_c4_requests_with_huffman() {
        story(TABLE_SIZE, &C4, &REQUESTS);
    }

    #[test]
    fn rfc7541_c5_responses_without_huffman_evict_from_a_256_byte_table() {
        story(256, &C5, &RESPONSES);
    }

    #[test]
    fn rfc7541_c6_responses_with_huffman_evict_from_a_256_byte_table() {
        story(256, &C6, &RESPONSES);
    }

    #[test]
    fn what_status_and_field_write_decodes_back() {
        let mut out = SIZE_UPDATE_ZERO.to_vec();
        status(&mut out, 200);
        status(&mut out, 502);
        field(&mut out, b"Content-Type", b"text/html");
        field(&mut out, b"X-Custom", b"v");
        field(&mut out, b"Set-Cookie", b"a=b");
        field(&mut out, b"age", b"0");
        // Checked once with Python's `hpack` 4.2 (`Decoder().decode(..., raw=True)`
        // gives the same six fields, `set-cookie` as a NeverIndexedHeaderTuple).
        assert_eq!(
            out,
            hex(concat!(
                "20",
                "88",
                "0803353032",
                "0f1009746578742f68746d6c",
                "0008782d637573746f6d0176",
                "1f2803613d62",
                "0f060130"
            ))
        );
        let mut f = Fields::new();
        Decoder::new().decode(&out, 4096, &mut f).unwrap();
        assert_eq!(
            list(&f),
            pairs(&[
                (":status", "200"),
                (":status", "502"),
                ("content-type", "text/html"),
                ("x-custom", "v"),
                ("set-cookie", "a=b"),
                ("age", "0"),
            ])
        );
    }

    #[test]
    fn names_compare_without_case_and_only_as_whole_names() {
        assert!(same_name(b"content-type", b"Content-Type"));
        assert!(same_name(b"proxy-authorization", b"PROXY-AUTHORIZATION"));
        assert!(same_name(b":status", b":status"));
        assert!(!same_name(b"content-type", b"content-typf"));
        assert!(!same_name(b"content-type", b"content_type"));
        assert!(!same_name(b"etag", b"etags"));
        assert!(!same_name(b"date", b"dat1"));
    }

    #[test]
    fn every_static_name_is_found_by_its_first_index_whatever_its_case() {
        for (i, name) in STATIC_NAMES.iter().enumerate() {
            let first = STATIC_NAMES.iter().position(|n| n == name).unwrap() + 1;
            assert_eq!(static_name(name), Some(first), "{}", i + 1);
            assert_eq!(static_name(&name.to_ascii_uppercase()), Some(first));
        }
        assert_eq!(static_name(b"x-forwarded-for"), None);
        assert_eq!(static_name(b""), None);
        assert_eq!(static_name(&[b'a'; 40]), None);
    }

    #[test]
    fn every_status_decodes_back() {
        let mut d = Decoder::new();
        let mut f = Fields::new();
        for code in [
            100, 101, 103, 200, 204, 206, 299, 304, 400, 404, 500, 503, 999,
        ] {
            let mut out = Vec::new();
            status(&mut out, code);
            assert_eq!(out.len() == 1, STATUSES.iter().any(|s| s.0 == code));
            d.decode(&out, 4096, &mut f).unwrap();
            assert_eq!(list(&f), pairs(&[(":status", &code.to_string())]));
        }
    }

    #[test]
    fn credentials_are_never_indexed_and_long_names_and_values_take_long_integers() {
        let value = vec![b'v'; 300];
        for (name, first) in [
            (&b"Authorization"[..], 0x1f),
            (b"proxy-authorization", 0x1f),
            (b"set-cookie", 0x1f),
            (b"www-authenticate", 0x0f),
            (b"cookie", 0x0f),
            (b"x-not-static", 0x00),
        ] {
            let mut out = Vec::new();
            field(&mut out, name, &value);
            assert_eq!(out[0], first, "{}", String::from_utf8_lossy(name));
            let mut f = Fields::new();
            Decoder::new().decode(&out, 4096, &mut f).unwrap();
            let (n, v) = f.iter().next().unwrap();
            assert_eq!(n, name.to_ascii_lowercase());
            assert_eq!(v, &value[..]);
        }
    }

    #[test]
    fn a_size_update_above_4096_or_after_a_field_is_an_error() {
        let mut f = Fields::new();
        // 4096 itself (0x3f e1 1f) is allowed, then a field.
        assert!(Decoder::new()
            .decode(&hex("3fe11f82"), 4096, &mut f)
            .is_ok());
        assert_eq!(
            Decoder::new().decode(&hex("3fe21f82"), 4096, &mut f),
            Err(Compression::TableSize(4097))
        );
        assert_eq!(
            Decoder::new().decode(&hex("8220"), 4096, &mut f),
            Err(Compression::SizeUpdateAfterField)
        );
        // A block of only a size update is at the block's start: no fields.
        assert_eq!(Decoder::new().decode(&hex("20"), 4096, &mut f), Ok(()));
        assert!(f.iter().next().is_none());
        assert!(Decoder::new().decode(&hex("202082"), 4096, &mut f).is_ok());
    }

    #[test]
    fn a_bomb_costs_the_bound_not_its_decoded_size_and_the_table_stays_in_step() {
        // One 4,033-byte entry into the table, then referenced 20,000 times: 80 MB
        // decoded.
        let mut block = vec![0x40, 0x01, b'x', 0x7f];
        block.extend_from_slice(&[0xa1, 0x1e]); // 127 + 33 + (30 << 7) = 4,000
        block.extend_from_slice(&[b'a'; 4000]);
        block.extend_from_slice(&[0xbe; 20_000]);
        let mut d = Decoder::new();
        let mut f = Fields::new();
        d.decode(&block, 16 << 10, &mut f).unwrap();
        assert!(f.over());
        assert_eq!(f.len(), 4);
        assert_eq!(f.list_size(), 20_001 * 4033);
        assert!(f.bytes.capacity() <= 32 << 10, "{}", f.bytes.capacity());
        assert!(f.spans.capacity() <= 16);
        // The next block still finds the entry at 62.
        d.decode(&[0xbe], 16 << 10, &mut f).unwrap();
        assert!(!f.over());
        assert_eq!(f.len(), 1);
        assert_eq!(f.iter().next().unwrap().1.len(), 4000);
    }

    #[test]
    fn fields_past_the_bound_are_dropped_even_if_smaller() {
        let mut out = Vec::new();
        field(&mut out, b"a", &[b'1'; 40]);
        field(&mut out, b"b", &[b'2'; 40]);
        field(&mut out, b"c", b"");
        let mut f = Fields::new();
        Decoder::new().decode(&out, 100, &mut f).unwrap();
        assert!(f.over());
        assert_eq!(f.len(), 1);
        assert_eq!(f.list_size(), 73 + 73 + 33);
        Decoder::new().decode(&out, 179, &mut f).unwrap();
        assert!(!f.over());
        assert_eq!(f.len(), 3);
    }

    /// Every RFC block, each from the start of a fresh table (the later ones refer
    /// to entries not there: errors, as a peer out of step would cause).
    fn real_blocks() -> Vec<Vec<u8>> {
        C3.iter()
            .chain(&C4)
            .chain(&C5)
            .chain(&C6)
            .map(|b| hex(b))
            .collect()
    }

    /// Decodes `blocks` on one decoder: never panics, and what is kept stays
    /// within the bound.
    fn decode_all(blocks: &[Vec<u8>], max_list: usize) {
        let mut d = Decoder::new();
        let mut f = Fields::new();
        for b in blocks {
            if d.decode(b, max_list, &mut f).is_ok() {
                let kept: usize = f.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
                assert!(kept <= max_list);
                assert_eq!(f.over(), f.list_size() > max_list);
            }
        }
    }

    proptest! {
        #![proptest_config(config(512))]

        #[test]
        fn random_bytes_never_panic(
            blocks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 1..4),
            max_list in 0usize..512,
        ) {
            decode_all(&blocks, max_list);
        }

        #[test]
        fn mutated_real_blocks_never_panic(
            picks in prop::collection::vec((0usize..12, prop::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 0..4), any::<usize>()), 1..4),
            max_list in 0usize..512,
        ) {
            let real = real_blocks();
            let blocks: Vec<Vec<u8>> = picks
                .iter()
                .map(|(which, edits, cut)| {
                    let mut b = real[*which].clone();
                    for &(at, byte, how) in edits {
                        let at = at % (b.len() + 1);
                        match how {
                            0 if at < b.len() => b[at] = byte,
                            1 => b.insert(at, byte),
                            _ if at < b.len() => { b.remove(at); }
                            _ => {}
                        }
                    }
                    b.truncate(cut % (b.len() + 1));
                    b
                })
                .collect();
            decode_all(&blocks, max_list);
        }

        #[test]
        fn any_field_written_decodes_back_lowercased(
            fields in prop::collection::vec(("[!#$%&'*+.^_`|~0-9A-Za-z-]{1,40}", prop::collection::vec(any::<u8>(), 0..200)), 0..8),
            code in 100u16..1000,
        ) {
            let mut out = SIZE_UPDATE_ZERO.to_vec();
            status(&mut out, code);
            for (n, v) in &fields {
                field(&mut out, n.as_bytes(), v);
            }
            let mut f = Fields::new();
            Decoder::new().decode(&out, usize::MAX, &mut f).unwrap();
            let got: Vec<(Vec<u8>, Vec<u8>)> = f.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
            let mut want = vec![(b":status".to_vec(), code.to_string().into_bytes())];
            want.extend(fields.iter().map(|(n, v)| (n.to_ascii_lowercase().into_bytes(), v.clone())));
            prop_assert_eq!(got, want);
        }
    }
}
