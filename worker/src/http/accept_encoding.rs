//! `Accept-Encoding` (RFC 9110 §12.5.3): which of the encodings a route can send the
//! client takes, by q-value, `identity;q=0` and `*` honoured.

/// A content coding forkd can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Br,
    Gzip,
    Identity,
}

impl Coding {
    fn token(self) -> &'static [u8] {
        match self {
            Coding::Br => b"br",
            Coding::Gzip => b"gzip",
            Coding::Identity => b"identity",
        }
    }
}

/// The q-value (in thousandths) `header` gives `coding`. No header: only identity
/// is wanted (RFC 9110 §12.5.3: any coding is acceptable, but sending one unasked
/// breaks clients that did not say so).
pub fn quality(header: Option<&[u8]>, coding: Coding) -> u16 {
    let Some(header) = header else {
        return if coding == Coding::Identity { 1000 } else { 0 };
    };
    let mut star = None;
    let mut own = None;
    for element in header.split(|&b| b == b',') {
        let mut params = element.split(|&b| b == b';');
        let name = params.next().unwrap_or_default().trim_ascii();
        if name.is_empty() {
            continue;
        }
        let mut q = 1000;
        for p in params {
            let p = p.trim_ascii();
            if let Some(v) = p.strip_prefix(b"q=").or_else(|| p.strip_prefix(b"Q=")) {
                q = parse_q(v).unwrap_or(0);
            }
        }
        let same = name.eq_ignore_ascii_case(coding.token())
            || (coding == Coding::Gzip && name.eq_ignore_ascii_case(b"x-gzip"));
        if same {
            own = Some(own.map_or(q, |o: u16| o.max(q)));
        } else if name == b"*" {
            star = Some(q);
        }
    }
    match (own, star, coding) {
        (Some(q), _, _) => q,
        (None, Some(q), _) => q,
        // Identity is acceptable unless refused by name or by `*;q=0`; unnamed, it
        // comes after every coding the client named.
        (None, None, Coding::Identity) => 1,
        (None, None, _) => 0,
    }
}

/// `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )`, in thousandths.
fn parse_q(v: &[u8]) -> Option<u16> {
    let v = v.trim_ascii();
    let (int, frac) = match v.iter().position(|&b| b == b'.') {
        Some(i) => (&v[..i], &v[i + 1..]),
        None => (v, &b""[..]),
    };
    if frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut thousandths = 0u16;
    for i in 0..3 {
        thousandths = thousandths * 10 + frac.get(i).map_or(0, |d| u16::from(d - b'0'));
    }
    match int {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// The coding to send among `available` (in the server's order of preference):
/// the highest q-value above 0; ties go to the earlier one. None: nothing offered
/// is acceptable (the caller sends identity anyway, as nginx does, or 406).
pub fn choose(header: Option<&[u8]>, available: &[Coding]) -> Option<Coding> {
    let mut best: Option<(Coding, u16)> = None;
    for &c in available {
        let q = quality(header, c);
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((c, q));
        }
    }
    best.map(|(c, _)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Coding::*;

    const ALL: &[Coding] = &[Br, Gzip, Identity];

    #[test]
    fn q_values_decide() {
        assert_eq!(choose(Some(b"gzip, br"), ALL), Some(Br));
        assert_eq!(choose(Some(b"gzip;q=1, br;q=0.5"), ALL), Some(Gzip));
        assert_eq!(choose(Some(b"br;q=0, gzip;q=0.001"), ALL), Some(Gzip));
        assert_eq!(choose(Some(b"gzip;q=0"), ALL), Some(Identity));
        assert_eq!(choose(Some(b""), ALL), Some(Identity));
        assert_eq!(choose(None, ALL), Some(Identity));
        assert_eq!(choose(Some(b"deflate"), ALL), Some(Identity));
        assert_eq!(choose(Some(b"x-gzip"), &[Gzip, Identity]), Some(Gzip));
    }

    #[test]
    fn star_and_identity_refusal() {
        assert_eq!(choose(Some(b"*"), ALL), Some(Br));
        assert_eq!(choose(Some(b"*;q=0.5, br;q=0"), ALL), Some(Gzip));
        assert_eq!(choose(Some(b"identity;q=0"), ALL), None);
        assert_eq!(choose(Some(b"*;q=0"), ALL), None);
        assert_eq!(choose(Some(b"*;q=0, identity"), ALL), Some(Identity));
        assert_eq!(
            choose(Some(b"gzip;q=0.5, identity;q=0"), &[Br, Gzip, Identity]),
            Some(Gzip)
        );
        assert_eq!(
            choose(Some(b"gzip;q=0.5"), ALL),
            Some(Gzip),
            "unnamed identity last"
        );
        assert_eq!(choose(Some(b"gzip;q=0.5, identity"), ALL), Some(Identity));
        assert_eq!(
            choose(Some(b"gzip;q=2"), &[Gzip, Identity]),
            Some(Identity),
            "bad q: 0"
        );
        assert_eq!(choose(Some(b"GZIP;Q=0.8"), &[Gzip, Identity]), Some(Gzip));
    }
}
