//! The part of Ollama's Go templates a `/api/generate` request's `template` may use here:
//! `{{ .System }}`, `{{ .Prompt }}`, `{{ .Suffix }}`, `{{ .Response }}` (where the reply
//! starts: the rest of the template is not part of the prompt), `{{ if .X }}`, `{{ else }}`,
//! `{{ end }}` on those, comments, and the `{{-`/`-}}` trim markers. Any other action (loops
//! over `.Messages`, functions, pipelines) is refused by name rather than rendered wrong.

use super::OllamaError;

/// What a template's fields hold.
pub(super) struct Values<'a> {
    /// `.System`.
    pub system: &'a str,
    /// `.Prompt`.
    pub prompt: &'a str,
    /// `.Suffix`.
    pub suffix: &'a str,
}

/// Deepest nesting of `if` actions accepted.
const MAX_DEPTH: usize = 32;

/// One open `if`: whether its current branch is taken, and whether its condition held.
struct Branch {
    on: bool,
    cond: bool,
    in_else: bool,
}

/// The prompt `template` gives with `v`.
pub(super) fn render(template: &str, v: &Values) -> Result<String, OllamaError> {
    let bad = |what: String| OllamaError::bad(format!("template: {what}"));
    let mut out = String::new();
    let mut open: Vec<Branch> = Vec::new();
    let mut rest = template;
    let mut trim_next = false;
    loop {
        let active = open.iter().all(|b| b.on);
        let Some(start) = rest.find("{{") else {
            if active {
                out.push_str(if trim_next { rest.trim_start() } else { rest });
            }
            break;
        };
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| bad("an action is not closed with }}".into()))?;
        let inner = &after[..end];
        // Go's trim markers are `{{- ` and ` -}}`: a dash beside a space.
        let trim_left = inner.starts_with("- ") || inner == "-";
        let trim_right = inner.ends_with(" -");
        let mut text = &rest[..start];
        if trim_next {
            text = text.trim_start();
        }
        if trim_left {
            text = text.trim_end();
        }
        if active {
            out.push_str(text);
        }
        let action = inner.strip_prefix("- ").unwrap_or(inner);
        let action = action.strip_suffix(" -").unwrap_or(action).trim();
        rest = &after[end + 2..];
        trim_next = trim_right;
        let field = |name: &str| match name {
            ".System" => Some(v.system),
            ".Prompt" => Some(v.prompt),
            ".Suffix" => Some(v.suffix),
            _ => None,
        };
        if action.starts_with("/*") && action.ends_with("*/") {
            continue;
        }
        if action == ".Response" {
            // The reply is generated from here: what follows is not part of the prompt.
            return Ok(out);
        }
        if let Some(value) = field(action) {
            if active {
                out.push_str(value);
            }
        } else if let Some(cond) = action.strip_prefix("if ").map(str::trim) {
            let value = field(cond).ok_or_else(|| unsupported(action))?;
            if open.len() == MAX_DEPTH {
                return Err(bad(format!("more than {MAX_DEPTH} nested if actions")));
            }
            let cond = !value.is_empty();
            open.push(Branch {
                on: cond,
                cond,
                in_else: false,
            });
        } else if action == "else" {
            match open.last_mut() {
                Some(b) if !b.in_else => {
                    b.in_else = true;
                    b.on = !b.cond;
                }
                _ => return Err(bad("{{ else }} outside an if".into())),
            }
        } else if action == "end" {
            open.pop()
                .ok_or_else(|| bad("{{ end }} without an if".into()))?;
        } else {
            return Err(unsupported(action));
        }
    }
    if !open.is_empty() {
        return Err(bad("an if is not closed with {{ end }}".into()));
    }
    Ok(out)
}

/// The error for an action outside the subset.
fn unsupported(action: &str) -> OllamaError {
    OllamaError::bad(format!(
        "template: {{{{ {action} }}}} is not supported; this server renders .System, .Prompt, \
         .Suffix and .Response, with if/else/end on the first three"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Values<'static> {
        Values {
            system: "Be brief.",
            prompt: "Hi",
            suffix: "",
        }
    }

    #[test]
    fn the_subset_renders_as_go_would() {
        let chatml = "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}\
                      <|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n\
                      {{ .Response }}<|im_end|>\n";
        assert_eq!(
            render(chatml, &values()).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        let no_system = Values {
            system: "",
            ..values()
        };
        assert_eq!(
            render(
                "{{ if .System }}S{{ else }}none{{ end }}:{{.Prompt}}",
                &no_system
            )
            .unwrap(),
            "none:Hi"
        );
        assert_eq!(
            render("a  {{- .Prompt -}}  b {{/* note */}}c", &values()).unwrap(),
            "aHib c"
        );
        let fim = Values {
            suffix: "}",
            ..values()
        };
        assert_eq!(
            render("<PRE>{{ .Prompt }}<SUF>{{ .Suffix }}<MID>", &fim).unwrap(),
            "<PRE>Hi<SUF>}<MID>"
        );
    }

    #[test]
    fn anything_else_is_refused() {
        for t in [
            "{{ range .Messages }}{{ end }}",
            "{{ .Prompt | upper }}",
            "{{ if .Tools }}x{{ end }}",
            "{{ .Prompt }",
            "{{ end }}",
            "{{ else }}",
            "{{ if .System }}open",
        ] {
            assert!(render(t, &values()).is_err(), "{t}");
        }
        let deep = "{{ if .Prompt }}".repeat(MAX_DEPTH + 1);
        assert!(render(&deep, &values()).is_err());
    }
}
