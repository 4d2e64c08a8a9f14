//! Keeps every crate layered: no circle of imports between the files (modules) of
//! `forkd-shared`, `forkd-worker` or `forkd` (the master), so each file can be read,
//! and changed, knowing only what lies below it.
//!
//! The source is read as tokens (comments and literals dropped) and every path a
//! file names is resolved to the file that defines it:
//!
//! - `use` trees, and paths in code starting with `crate::`, `super::`, `self::` or
//!   with a child module's name;
//! - through `pub use` re-exports: `crate::shm::Region` is `shm/mapping.rs` when
//!   `shm/mod.rs` says `pub use mapping::Region`. A re-export is routing, not a use:
//!   it is no edge of the file that makes it;
//! - items under `#[cfg(test)]` are left out: tests may reach across layers.
//!
//! A circle is reported with the line of each import that closes it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open(char),
    Close(char),
    Semi,
    Comma,
    Hash,
    Bang,
    Star,
    Other,
}

/// `source` as tokens with their line; comments, strings, chars and numbers dropped.
fn tokens(source: &str) -> Vec<(Tok, usize)> {
    let b = source.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < b.len() {
        let c = b[i];
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        line += usize::from(b[i] == b'\n');
                        i += 1;
                    }
                }
            }
            b'r' if matches!(b.get(i + 1), Some(b'"' | b'#'))
                && (i == 0 || !is_ident(b[i - 1])) =>
            {
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    // `r#ident`: a raw identifier.
                    i += 1;
                    continue;
                }
                j += 1;
                loop {
                    if j >= b.len() {
                        break;
                    }
                    if b[j] == b'"'
                        && b[j + 1..]
                            .iter()
                            .take(hashes)
                            .filter(|&&h| h == b'#')
                            .count()
                            == hashes
                    {
                        j += 1 + hashes;
                        break;
                    }
                    line += usize::from(b[j] == b'\n');
                    j += 1;
                }
                i = j;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    line += usize::from(b.get(i) == Some(&b'\n'));
                    i += 1;
                }
                i += 1;
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
                if b.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                } else {
                    let ch_len = source[i + 1..].chars().next().map_or(1, char::len_utf8);
                    if b.get(i + 1 + ch_len) == Some(&b'\'') {
                        i += 2 + ch_len;
                    } else {
                        i += 1;
                        while i < b.len() && is_ident(b[i]) {
                            i += 1;
                        }
                    }
                }
            }
            c if c.is_ascii_digit() => {
                while i < b.len() && (is_ident(b[i]) || b[i] == b'.') {
                    i += 1;
                }
                out.push((Tok::Other, line));
            }
            c if is_ident(c) => {
                let start = i;
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                out.push((Tok::Ident(source[start..i].to_owned()), line));
            }
            b':' if b.get(i + 1) == Some(&b':') => {
                out.push((Tok::PathSep, line));
                i += 2;
            }
            b'{' | b'(' | b'[' => {
                out.push((Tok::Open(c as char), line));
                i += 1;
            }
            b'}' | b')' | b']' => {
                out.push((Tok::Close(c as char), line));
                i += 1;
            }
            b';' | b',' | b'#' | b'!' | b'*' => {
                let t = match c {
                    b';' => Tok::Semi,
                    b',' => Tok::Comma,
                    b'#' => Tok::Hash,
                    b'!' => Tok::Bang,
                    _ => Tok::Star,
                };
                out.push((t, line));
                i += 1;
            }
            c if c.is_ascii_whitespace() => i += 1,
            _ => {
                out.push((Tok::Other, line));
                i += source[i..].chars().next().map_or(1, char::len_utf8);
            }
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// One crate's files: module path (`["shm", "layout"]`) to file.
fn module_files(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut modules = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension() != Some(std::ffi::OsStr::new("rs")) {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let mut segs: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if matches!(
                segs.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                segs.pop();
            }
            modules.insert(segs, path);
        }
    }
    modules
}

/// A path a file names, from the module it is named in.
struct Named {
    from: Vec<String>,
    path: Vec<String>,
    line: usize,
}

/// A `pub use` in module `.0`: name `.1` stands for path `.2`.
type Reexport = (Vec<String>, String, Vec<String>);

/// What one file names and re-exports.
#[derive(Default)]
struct FileUses {
    uses: Vec<(Vec<String>, usize)>,
    /// `pub use` names to the absolute path they stand for.
    reexports: BTreeMap<String, Vec<String>>,
}

/// Expands the `use` tree at `toks[*i..]` (just past `use`) into full paths.
fn use_tree(
    toks: &[(Tok, usize)],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, String, usize)>,
) {
    let mut path = prefix.to_vec();
    while *i < toks.len() {
        let (tok, line) = &toks[*i];
        match tok {
            Tok::Ident(name) if name == "as" => {
                *i += 1;
                if let Some((Tok::Ident(alias), _)) = toks.get(*i) {
                    *i += 1;
                    out.push((path.clone(), alias.clone(), *line));
                }
                return;
            }
            Tok::Ident(name) => {
                path.push(name.clone());
                *i += 1;
            }
            Tok::PathSep => *i += 1,
            Tok::Star => {
                *i += 1;
                out.push((path.clone(), "*".into(), *line));
                return;
            }
            Tok::Open('{') => {
                *i += 1;
                loop {
                    match toks.get(*i).map(|t| &t.0) {
                        Some(Tok::Close('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Comma) => *i += 1,
                        None => return,
                        _ => use_tree(toks, i, &path, out),
                    }
                }
            }
            _ => break,
        }
    }
    let last = match path.last() {
        Some(s) if s == "self" => {
            path.pop();
            path.last().cloned().unwrap_or_default()
        }
        Some(s) => s.clone(),
        None => return,
    };
    out.push((path, last, toks[(*i).min(toks.len() - 1)].1));
}

/// Index past the bracketed group opening at `i`.
fn skip_group(toks: &[(Tok, usize)], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < toks.len() {
        match toks[i].0 {
            Tok::Open(_) => depth += 1,
            Tok::Close(_) => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// Index past the item starting at `i` (up to its `;` or its closing brace), or
/// past the field or argument (up to its `,` or the enclosing close).
fn skip_item(toks: &[(Tok, usize)], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < toks.len() {
        match toks[i].0 {
            Tok::Open(_) => depth += 1,
            Tok::Close(_) if depth == 0 => return i,
            Tok::Close(c) => {
                depth -= 1;
                if depth == 0 && c == '}' {
                    return i + 1;
                }
            }
            Tok::Semi | Tok::Comma if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Everything `source` (the file of module `module`) names, with crate-relative
/// paths still relative to the module they appear in.
fn scan(
    source: &str,
    module: &[String],
    children: &BTreeSet<String>,
) -> (Vec<Named>, Vec<Reexport>) {
    let toks = tokens(source);
    let mut named = Vec::new();
    let mut reexports = Vec::new();
    // Inline `mod x { .. }`: the brace depth each one closes at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut test_item = false;
    let mut public = false;
    let mut i = 0;
    let here = |inline: &[(String, usize)]| {
        let mut m = module.to_vec();
        m.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    while i < toks.len() {
        let (tok, line) = &toks[i];
        match tok {
            Tok::Hash => {
                // An attribute: `#[...]` or `#![...]`.
                let mut j = i + 1;
                if toks.get(j).map(|t| &t.0) == Some(&Tok::Bang) {
                    j += 1;
                }
                let end = skip_group(&toks, j);
                let attr: Vec<&Tok> = toks[j..end].iter().map(|t| &t.0).collect();
                let is_cfg_test = attr.windows(4).any(|w| {
                    w[0] == &Tok::Ident("cfg".into())
                        && w[1] == &Tok::Open('(')
                        && w[2] == &Tok::Ident("test".into())
                        && w[3] == &Tok::Close(')')
                });
                if is_cfg_test && toks.get(i + 1).map(|t| &t.0) != Some(&Tok::Bang) {
                    test_item = true;
                }
                i = end;
                continue;
            }
            _ if test_item => {
                test_item = false;
                public = false;
                i = skip_item(&toks, i);
                continue;
            }
            Tok::Ident(k) if k == "pub" => {
                public = true;
                i += 1;
                if toks.get(i).map(|t| &t.0) == Some(&Tok::Open('(')) {
                    i = skip_group(&toks, i);
                }
                continue;
            }
            Tok::Ident(k) if k == "use" => {
                i += 1;
                let mut tree = Vec::new();
                use_tree(&toks, &mut i, &[], &mut tree);
                let from = here(&inline);
                for (path, name, line) in tree {
                    if public {
                        reexports.push((from.clone(), name, path));
                    } else {
                        named.push(Named {
                            from: from.clone(),
                            path,
                            line,
                        });
                    }
                }
                public = false;
                continue;
            }
            Tok::Ident(k) if k == "mod" => {
                public = false;
                if let (Some((Tok::Ident(name), _)), Some((Tok::Open('{'), _))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                    continue;
                }
                i += 1;
                continue;
            }
            Tok::Ident(first)
                if toks.get(i + 1).map(|t| &t.0) == Some(&Tok::PathSep)
                    && (i == 0 || toks[i - 1].0 != Tok::PathSep) =>
            {
                let relative = matches!(first.as_str(), "crate" | "super" | "self")
                    || (inline.is_empty() && children.contains(first));
                let mut path = vec![first.clone()];
                let mut j = i + 1;
                while let (Some((Tok::PathSep, _)), Some((Tok::Ident(seg), _))) =
                    (toks.get(j), toks.get(j + 1))
                {
                    path.push(seg.clone());
                    j += 2;
                }
                if relative {
                    named.push(Named {
                        from: here(&inline),
                        path,
                        line: *line,
                    });
                }
                public = false;
                i = j;
                continue;
            }
            Tok::Open(_) => depth += 1,
            Tok::Close(_) => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        public = false;
        i += 1;
    }
    (named, reexports)
}

/// `path`, named in module `from`, as a crate-absolute path; `None` for another crate.
fn absolute(
    from: &[String],
    path: &[String],
    modules: &BTreeMap<Vec<String>, PathBuf>,
) -> Option<Vec<String>> {
    let mut base = from.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        Some(first) => {
            let mut child = from.to_vec();
            child.push(first.to_owned());
            if !modules.keys().any(|m| m.starts_with(&child)) {
                return None;
            }
        }
        None => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The file that defines `path`, following re-exports.
fn resolve<'a>(
    path: &[String],
    modules: &'a BTreeMap<Vec<String>, PathBuf>,
    uses: &BTreeMap<Vec<String>, FileUses>,
    hops: usize,
) -> Option<&'a Vec<String>> {
    let n = (0..=path.len())
        .rev()
        .find(|&n| modules.contains_key(&path[..n]))?;
    let (module, _) = modules.get_key_value(&path[..n])?;
    if let (Some(item), Some(file)) = (path.get(n), uses.get(module)) {
        if let Some(target) = file.reexports.get(item) {
            if hops < 8 {
                let mut next = target.clone();
                next.extend(path[n + 1..].iter().cloned());
                return resolve(&next, modules, uses, hops + 1).or(Some(module));
            }
        }
    }
    Some(module)
}

/// Circles among the files of the crate whose source is `src`, each drawn as its
/// imports (`a.rs:12 -> b.rs`).
fn circles(src: &Path) -> Vec<Vec<String>> {
    let modules = module_files(src);
    let mut scanned = BTreeMap::new();
    let mut uses: BTreeMap<Vec<String>, FileUses> = BTreeMap::new();
    for (module, file) in &modules {
        let children: BTreeSet<String> = modules
            .keys()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .map(|m| m.last().unwrap().clone())
            .collect();
        let source = std::fs::read_to_string(file).unwrap();
        let (named, reexports) = scan(&source, module, &children);
        let entry = uses.entry(module.clone()).or_default();
        for (from, name, path) in reexports {
            if let Some(abs) = absolute(&from, &path, &modules) {
                entry.reexports.insert(name, abs);
            }
        }
        scanned.insert(module.clone(), named);
    }
    for (module, named) in &scanned {
        for n in named {
            if let Some(abs) = absolute(&n.from, &n.path, &modules) {
                uses.get_mut(module).unwrap().uses.push((abs, n.line));
            }
        }
    }
    // Edges between files, with the first line naming each.
    let mut edges: BTreeMap<&Vec<String>, BTreeMap<&Vec<String>, usize>> = BTreeMap::new();
    for (module, file) in &uses {
        let from = modules.get_key_value(module).unwrap().0;
        for (path, line) in &file.uses {
            if let Some(to) = resolve(path, &modules, &uses, 0) {
                if to != from {
                    edges.entry(from).or_default().entry(to).or_insert(*line);
                }
            }
        }
    }
    let name = |m: &Vec<String>| modules[m].strip_prefix(src).unwrap().display().to_string();
    strongly_connected(&modules.keys().collect::<Vec<_>>(), &edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|members| {
            let set: BTreeSet<_> = members.iter().copied().collect();
            let mut drawn = Vec::new();
            for m in &members {
                for (to, line) in edges.get(m).into_iter().flatten() {
                    if set.contains(to) {
                        drawn.push(format!("{}:{line} -> {}", name(m), name(to)));
                    }
                }
            }
            drawn
        })
        .collect()
}

/// Tarjan's strongly connected components.
fn strongly_connected<'a>(
    nodes: &[&'a Vec<String>],
    edges: &BTreeMap<&'a Vec<String>, BTreeMap<&'a Vec<String>, usize>>,
) -> Vec<Vec<&'a Vec<String>>> {
    struct State<'a> {
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        out: Vec<Vec<&'a Vec<String>>>,
    }
    fn visit<'a>(
        v: &'a Vec<String>,
        edges: &BTreeMap<&'a Vec<String>, BTreeMap<&'a Vec<String>, usize>>,
        s: &mut State<'a>,
    ) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in edges.get(v).into_iter().flat_map(|e| e.keys()) {
            if !s.index.contains_key(w) {
                visit(w, edges, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in nodes {
        if !s.index.contains_key(v) {
            visit(v, edges, &mut s);
        }
    }
    s.out
}

fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

fn assert_layered(name: &str) {
    let found = circles(&crate_src(name));
    assert!(
        found.is_empty(),
        "{name}: {} import circle(s) between files:\n{}",
        found.len(),
        found
            .iter()
            .map(|c| format!("  {}", c.join("\n  ")))
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

#[test]
fn shared_has_no_import_circle() {
    assert_layered("shared");
}

#[test]
fn worker_has_no_import_circle() {
    assert_layered("worker");
}

#[test]
fn master_has_no_import_circle() {
    assert_layered("master");
}

/// The checker sees a circle made of each kind of path it follows, and none where
/// there is none: a `use` tree, a path in code, a re-export, and `#[cfg(test)]`
/// left out.
#[test]
fn checker_finds_circles_through_uses_paths_and_reexports() {
    let dir = std::env::temp_dir().join(format!("forkd-layers-{}", std::process::id()));
    let src = dir.join("src");
    let write = |file: &str, text: &str| {
        let path = src.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    let _ = std::fs::remove_dir_all(&dir);
    write("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod d;\n");
    write("a/mod.rs", "pub mod inner;\npub use inner::Thing;\n");
    write("a/inner.rs", "// crate::b::X in a comment\nconst S: &str = \"crate::b::X\";\n#[cfg(test)]\nmod tests { use crate::c::Y; }\npub struct Thing;\n");
    write("b.rs", "use crate::{a::{Thing, inner as i}, d};\n");
    write("c.rs", "pub struct Y;\n");
    write("d.rs", "fn f() { let _ = crate::c::Y; }\n");
    assert!(circles(&src).is_empty(), "{:?}", circles(&src));

    // A use in code behind the re-export closes a circle: a/inner -> b -> a/inner.
    write(
        "a/inner.rs",
        "pub struct Thing;\nfn f() { let _ = super::super::b::g; }\n",
    );
    assert_eq!(circles(&src).len(), 1, "{:?}", circles(&src));

    // A `use` tree closes one: c -> d -> c.
    write("a/inner.rs", "pub struct Thing;\n");
    write("c.rs", "use crate::{d::{self}};\npub struct Y;\n");
    assert_eq!(
        circles(&src),
        vec![vec![
            "c.rs:1 -> d.rs".to_owned(),
            "d.rs:1 -> c.rs".to_owned()
        ]]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
