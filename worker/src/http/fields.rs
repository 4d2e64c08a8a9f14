//! Fields of a raw request head, found by name without parsing it again: for what
//! reads one field of a head already parsed (a rate key, a `Hash(Header(..))` key, a
//! real-IP header), with no bound on the number of fields.

/// The value of the first field `name` in a raw request head.
pub fn header<'h>(head: &'h [u8], name: &[u8]) -> Option<&'h [u8]> {
    headers(head, name).next()
}

/// The values of every field `name` in a raw request head, in order.
pub fn headers<'h, 'n>(head: &'h [u8], name: &'n [u8]) -> impl Iterator<Item = &'h [u8]> + 'n
where
    'h: 'n,
{
    head.split(|&b| b == b'\n').skip(1).filter_map(move |line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        line[..colon]
            .eq_ignore_ascii_case(name)
            .then(|| line[colon + 1..].trim_ascii())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_are_found_by_name_whatever_the_case() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\nx-api-KEY:  k-123 \r\nX-Api-Key: second\r\n\r\n";
        assert_eq!(header(head, b"X-Api-Key"), Some(&b"k-123"[..]));
        assert_eq!(header(head, b"Authorization"), None);
        assert_eq!(headers(head, b"x-api-key").count(), 2);
        // The request line is not a field.
        assert_eq!(header(b"GET /x: HTTP/1.1\r\n\r\n", b"GET /x"), None);
    }
}
