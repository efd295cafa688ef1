//! The entry points a kernel file defines, read from its source without NVRTC: the files make
//! their `extern "C" __global__` functions with macros (`FILL(u16, u16)` makes `fill_u16`), so
//! this runs a small C preprocessor — line splicing, comments, `#define` with or without
//! parameters, `##` pasting and rescanning — enough for these files, then reads each name.

use std::collections::HashMap;

/// A `#define`: its parameters (`None` for an object-like macro) and its body's tokens.
struct Macro {
    params: Option<Vec<String>>,
    body: Vec<String>,
}

/// Expansions allowed in one file before it counts as a runaway (a macro that expands to itself).
const MAX_EXPANSIONS: usize = 1_000_000;

/// The names of the `extern "C" __global__` functions `source` defines once its macros expand,
/// in order; an error names a macro call that does not close or an expansion that never ends.
pub fn entry_points(source: &str) -> Result<Vec<String>, String> {
    let spliced = source.replace("\\\r\n", " ").replace("\\\n", " ");
    let mut macros = HashMap::new();
    let mut text = Vec::new();
    for line in strip_comments(&spliced).lines() {
        let line = line.trim_start();
        match line.strip_prefix('#').map(str::trim_start) {
            Some(directive) => {
                if let Some(define) = directive.strip_prefix("define") {
                    let (name, m) = parse_define(define)?;
                    macros.insert(name, m);
                }
            }
            None => text.extend(tokens(line)),
        }
    }
    let expanded = expand(text, &macros)?;
    Ok(global_functions(&expanded))
}

/// `source` with every comment replaced by a space (string and character literals kept whole).
fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("//") {
            rest = rest.find('\n').map_or("", |end| &rest[end..]);
            out.push(' ');
        } else if rest.starts_with("/*") {
            rest = rest[2..].find("*/").map_or("", |end| &rest[end + 4..]);
            out.push(' ');
        } else if c == '"' || c == '\'' {
            let len = literal_len(rest, c);
            out.push_str(&rest[..len]);
            rest = &rest[len..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The length in bytes of the string or character literal opening `text` (quote `quote`).
fn literal_len(text: &str, quote: char) -> usize {
    let mut escaped = false;
    for (i, c) in text.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            _ if c == quote => return i + 1,
            _ => {}
        }
    }
    text.len()
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The tokens of one line: words (identifiers and numbers), literals, `##`, and single
/// characters otherwise.
fn tokens(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        let len = if c.is_whitespace() {
            rest = &rest[c.len_utf8()..];
            continue;
        } else if is_word(c) {
            rest.find(|c: char| !is_word(c)).unwrap_or(rest.len())
        } else if c == '"' || c == '\'' {
            literal_len(rest, c)
        } else if rest.starts_with("##") {
            2
        } else {
            c.len_utf8()
        };
        out.push(rest[..len].to_string());
        rest = &rest[len..];
    }
    out
}

/// The name and macro of what follows `#define`; parameters only where `(` touches the name.
fn parse_define(define: &str) -> Result<(String, Macro), String> {
    let define = define.trim_start();
    let name_len = define.find(|c: char| !is_word(c)).unwrap_or(define.len());
    let (name, rest) = define.split_at(name_len);
    if name.is_empty() {
        return Err(format!("#define without a name: {define:?}"));
    }
    let Some(after_paren) = rest.strip_prefix('(') else {
        return Ok((
            name.to_string(),
            Macro {
                params: None,
                body: tokens(rest),
            },
        ));
    };
    let close = after_paren
        .find(')')
        .ok_or_else(|| format!("#define {name}: its parameter list does not close"))?;
    let params = after_paren[..close]
        .split(',')
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    let body = tokens(&after_paren[close + 1..]);
    Ok((
        name.to_string(),
        Macro {
            params: Some(params),
            body,
        },
    ))
}

/// `text` with every macro call replaced by its body, rescanned with the tokens after it (as
/// C does, so `FOR_FLOATS(CAST_FROM)` goes on to expand each `CAST_FROM(...)` it makes).
fn expand(text: Vec<String>, macros: &HashMap<String, Macro>) -> Result<Vec<String>, String> {
    let mut pending: Vec<String> = text.into_iter().rev().collect();
    let mut out = Vec::new();
    let mut expansions = 0;
    while let Some(token) = pending.pop() {
        let Some(m) = macros.get(&token) else {
            out.push(token);
            continue;
        };
        let replacement = match &m.params {
            None => m.body.clone(),
            Some(params) if pending.last().is_some_and(|t| t == "(") => {
                pending.pop();
                let args = take_arguments(&mut pending).ok_or_else(|| format!("the call of {token} does not close"))?;
                substitute(&m.body, params, &args)
            }
            // A function-like macro's name without arguments is left as it is.
            Some(_) => {
                out.push(token);
                continue;
            }
        };
        expansions += 1;
        if expansions > MAX_EXPANSIONS {
            return Err(format!("macro {token} keeps expanding (does it expand to itself?)"));
        }
        pending.extend(replacement.into_iter().rev());
    }
    Ok(out)
}

/// The comma-separated arguments up to the `)` that closes a call, taken from `pending` (the
/// text ahead, reversed); `None` when it never closes.
fn take_arguments(pending: &mut Vec<String>) -> Option<Vec<Vec<String>>> {
    let mut args = vec![Vec::new()];
    let mut depth = 0;
    loop {
        let token = pending.pop()?;
        match token.as_str() {
            ")" if depth == 0 => return Some(args),
            "," if depth == 0 => args.push(Vec::new()),
            _ => {
                depth += usize::from(token == "(");
                depth -= usize::from(token == ")");
                args.last_mut()?.push(token);
            }
        }
    }
}

/// `body` with each parameter replaced by its argument and each `a ## b` pasted into one token.
fn substitute(body: &[String], params: &[String], args: &[Vec<String>]) -> Vec<String> {
    let arg = |token: &String| -> Vec<String> {
        match params.iter().position(|p| p == token) {
            Some(i) => args.get(i).cloned().unwrap_or_default(),
            None => vec![token.clone()],
        }
    };
    let mut out: Vec<String> = Vec::new();
    let mut body = body.iter();
    while let Some(token) = body.next() {
        if token != "##" {
            out.extend(arg(token));
            continue;
        }
        let mut right = body.next().map(arg).unwrap_or_default().into_iter();
        let joined = out.pop().unwrap_or_default() + &right.next().unwrap_or_default();
        out.push(joined);
        out.extend(right);
    }
    out
}

/// The name of each `extern "C" __global__` function in `tokens`: the first word after those
/// three that a `(` follows, past any `__launch_bounds__(...)`.
fn global_functions(tokens: &[String]) -> Vec<String> {
    let mut names = Vec::new();
    for (i, window) in tokens.windows(3).enumerate() {
        if window != ["extern", "\"C\"", "__global__"] {
            continue;
        }
        if let Some(name) = function_name(&tokens[i + 3..]) {
            names.push(name);
        }
    }
    names
}

/// The first identifier followed by `(` in `tokens` (a declaration after `__global__`), past a
/// `__launch_bounds__(…)`, whose arguments may call functions too.
fn function_name(tokens: &[String]) -> Option<String> {
    // The declaration up to its body, as `expand` keeps the text ahead: reversed.
    let body = tokens.iter().position(|t| t == "{").unwrap_or(tokens.len());
    let mut pending: Vec<String> = tokens[..body].iter().rev().cloned().collect();
    while let Some(token) = pending.pop() {
        if pending.last().is_none_or(|t| t != "(") {
            continue;
        }
        if token == "__launch_bounds__" {
            pending.pop();
            take_arguments(&mut pending)?;
        } else if token.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
            return Some(token);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macros_paste_names_and_rescan_what_they_make() {
        let source = r#"
            #define EACH(M) M(float, f32) M(half, f16)
            /* a comment with extern "C" __global__ void not_a_kernel( */
            #define KERNEL(T, s) \
                extern "C" __global__ void __launch_bounds__(128, blocks(2, min(3, 4))) step_##s(T* x) { x[0] = 1; } // no
            #define PAIR(T, s) KERNEL(T, s##_a) extern "C" __global__ void plain_##s() {}
            EACH(PAIR)
            extern "C" __global__ void literal(int n) {}
            __global__ void not_extern() {}
        "#;
        assert_eq!(
            entry_points(source).unwrap(),
            ["step_f32_a", "plain_f32", "step_f16_a", "plain_f16", "literal"]
        );
    }

    #[test]
    fn a_call_that_never_closes_or_never_ends_is_an_error() {
        let open = entry_points("#define M(x) x\nM(1, 2");
        assert!(open.unwrap_err().contains("M does not close"));
        let forever = entry_points("#define LOOP LOOP\nLOOP");
        assert!(forever.unwrap_err().contains("LOOP keeps expanding"));
    }

    #[test]
    fn every_layout_cast_and_copy_is_found() {
        let names = crate::LAYOUT.entry_points().unwrap();
        let values = ["f32", "f16", "bf16", "u32", "i64"];
        for from in values {
            for to in values {
                assert!(
                    names.contains(&format!("cast_{from}_{to}")),
                    "cast_{from}_{to} in {names:?}"
                );
            }
        }
        for width in ["u16", "u32", "u64"] {
            assert!(names.contains(&format!("copy_strided_{width}")));
        }
        assert_eq!(names.len(), 28, "{names:?}");
    }
}
