//! Named chat templates, as llama-server's `--chat-template NAME` offers them: Jinja sources
//! written to produce the same prompts as llama.cpp's built-in C++ formats (`llama-chat.cpp`).
//!
//! Like the C++ formats, they ignore `bos_token` (the tokenizer adds it), treat a message whose
//! content is not a string as empty, and trim only ASCII whitespace where they trim. Some formats
//! have no generation prompt of their own and ignore `add_generation_prompt`, as in llama.cpp.

/// The names of the built-in templates, sorted.
pub fn names() -> &'static [&'static str] {
    NAMES
}

const NAMES: &[&str] = &[
    "bailing",
    "bailing-think",
    "bailing2",
    "chatglm3",
    "chatglm4",
    "chatml",
    "command-r",
    "deepseek",
    "deepseek-ocr",
    "deepseek2",
    "deepseek3",
    "exaone-moe",
    "exaone3",
    "exaone4",
    "falcon3",
    "gemma",
    "gigachat",
    "glmedge",
    "gpt-oss",
    "granite",
    "granite-4.0",
    "granite-4.1",
    "grok-2",
    "hunyuan-dense",
    "hunyuan-moe",
    "hunyuan-vl",
    "kimi-k2",
    "llama2",
    "llama2-sys",
    "llama2-sys-bos",
    "llama2-sys-strip",
    "llama3",
    "llama4",
    "megrez",
    "minicpm",
    "mistral-v1",
    "mistral-v3",
    "mistral-v3-tekken",
    "mistral-v7",
    "mistral-v7-tekken",
    "monarch",
    "openchat",
    "orion",
    "pangu-embedded",
    "phi3",
    "phi4",
    "rwkv-world",
    "seed_oss",
    "smolvlm",
    "solar-open",
    "vicuna",
    "vicuna-orca",
    "yandex",
    "zephyr",
];

/// Defines `ws` (the characters C's `isspace` accepts) for `trim(ws)`.
const PRELUDE: &str = r#"{%- set ws = ' \t\n\r\x0b\x0c' -%}"#;

/// Opens the message loop: `m` the message, `r` its role, `c` its text.
const LOOP: &str = r#"{%- for m in messages -%}{%- set r = m.role -%}{%- set c = m.content if m.content is string else '' -%}"#;

const END: &str = "{%- endfor -%}";

/// `<before><body per message><after>` with the prelude and loop around the body.
fn looped(before: &str, body: &str, after: &str) -> String {
    format!("{PRELUDE}{before}{LOOP}{body}{END}{after}")
}

/// The generation prompt `text`, when one is asked for.
fn gen(text: &str) -> String {
    format!("{{%- if add_generation_prompt -%}}{{{{- '{text}' -}}}}{{%- endif -%}}")
}

/// The Jinja source of the built-in template `name`.
pub fn source(name: &str) -> Option<String> {
    let s = match name {
        "chatml" => return Some(super::CHATML_TEMPLATE.to_string()),
        "llama2" | "llama2-sys" | "llama2-sys-bos" | "llama2-sys-strip" => {
            let system = if name == "llama2" {
                "{{- c ~ '\\n' -}}"
            } else {
                "{{- '<<SYS>>\\n' ~ c ~ '\\n<</SYS>>\\n\\n' -}}"
            };
            let reopen = if name == "llama2-sys-bos" {
                "<s>[INST] "
            } else {
                "[INST] "
            };
            let strip = if name == "llama2-sys-strip" {
                "{%- set c = c|trim(ws) -%}"
            } else {
                ""
            };
            looped(
                "{%- set ns = namespace(inside=true) -%}{{- '[INST] ' -}}",
                &format!(
                    "{strip}{{%- if not ns.inside -%}}{{%- set ns.inside = true -%}}{{{{- '{reopen}' -}}}}{{%- endif -%}}\
                     {{%- if r == 'system' -%}}{system}\
                     {{%- elif r == 'user' -%}}{{{{- c ~ ' [/INST]' -}}}}\
                     {{%- else -%}}{{{{- c ~ '</s>' -}}}}{{%- set ns.inside = false -%}}{{%- endif -%}}"
                ),
                "",
            )
        }
        "mistral-v1" | "mistral-v3" | "mistral-v3-tekken" => {
            let lead = if name == "mistral-v1" { " " } else { "" };
            let trail = if name == "mistral-v3-tekken" { "" } else { " " };
            let reply = if name == "mistral-v3" {
                "c|trim(ws)"
            } else {
                "c"
            };
            looped(
                "{%- set ns = namespace(inside=false) -%}",
                &format!(
                    "{{%- if not ns.inside -%}}{{{{- '{lead}[INST]{trail}' -}}}}{{%- set ns.inside = true -%}}{{%- endif -%}}\
                     {{%- if r == 'system' -%}}{{{{- c ~ '\\n\\n' -}}}}\
                     {{%- elif r == 'user' -%}}{{{{- c ~ '{lead}[/INST]' -}}}}\
                     {{%- else -%}}{{{{- '{trail}' ~ {reply} ~ '</s>' -}}}}{{%- set ns.inside = false -%}}{{%- endif -%}}"
                ),
                "",
            )
        }
        "mistral-v7" | "mistral-v7-tekken" => {
            let sp = if name == "mistral-v7" { " " } else { "" };
            looped(
                "",
                &format!(
                    "{{%- if r == 'system' -%}}{{{{- '[SYSTEM_PROMPT]{sp}' ~ c ~ '[/SYSTEM_PROMPT]' -}}}}\
                     {{%- elif r == 'user' -%}}{{{{- '[INST]{sp}' ~ c ~ '[/INST]' -}}}}\
                     {{%- else -%}}{{{{- '{sp}' ~ c ~ '</s>' -}}}}{{%- endif -%}}"
                ),
                "",
            )
        }
        "phi3" => looped(
            "",
            r#"{{- '<|' ~ r ~ '|>\n' ~ c ~ '<|end|>\n' -}}"#,
            &gen(r"<|assistant|>\n"),
        ),
        "phi4" => looped(
            "",
            r#"{{- '<|im_start|>' ~ r ~ '<|im_sep|>' ~ c ~ '<|im_end|>' -}}"#,
            &gen("<|im_start|>assistant<|im_sep|>"),
        ),
        "falcon3" => looped(
            "",
            r#"{{- '<|' ~ r ~ '|>\n' ~ c ~ '\n' -}}"#,
            &gen(r"<|assistant|>\n"),
        ),
        "zephyr" => looped(
            "",
            r#"{{- '<|' ~ r ~ '|>\n' ~ c ~ '<|endoftext|>\n' -}}"#,
            &gen(r"<|assistant|>\n"),
        ),
        "monarch" => looped(
            "",
            r#"{{- ('' if loop.first else '<s>') ~ r ~ '\n' ~ c ~ '</s>\n' -}}"#,
            &gen(r"<s>assistant\n"),
        ),
        "gemma" => looped(
            "{%- set ns = namespace(system='') -%}",
            r#"{%- if r == 'system' -%}{%- set ns.system = ns.system ~ c|trim(ws) -%}{%- else -%}
               {%- set r = 'model' if r == 'assistant' else r -%}
               {{- '<start_of_turn>' ~ r ~ '\n' -}}
               {%- if ns.system and r != 'model' -%}{{- ns.system ~ '\n\n' -}}{%- set ns.system = '' -%}{%- endif -%}
               {{- c|trim(ws) ~ '<end_of_turn>\n' -}}{%- endif -%}"#,
            &gen(r"<start_of_turn>model\n"),
        ),
        "orion" => looped(
            "{%- set ns = namespace(system='') -%}",
            r#"{%- if r == 'system' -%}{%- set ns.system = ns.system ~ c -%}
               {%- elif r == 'user' -%}{{- 'Human: ' -}}
               {%- if ns.system -%}{{- ns.system ~ '\n\n' -}}{%- set ns.system = '' -%}{%- endif -%}
               {{- c ~ '\n\nAssistant: </s>' -}}
               {%- else -%}{{- c ~ '</s>' -}}{%- endif -%}"#,
            "",
        ),
        "openchat" => looped(
            "",
            r#"{%- if r == 'system' -%}{{- c ~ '<|end_of_turn|>' -}}
               {%- else -%}{{- 'GPT4 Correct ' ~ r[:1]|upper ~ r[1:] ~ ': ' ~ c ~ '<|end_of_turn|>' -}}{%- endif -%}"#,
            &gen("GPT4 Correct Assistant:"),
        ),
        "vicuna" | "vicuna-orca" => {
            let system = if name == "vicuna" {
                r"c ~ '\n\n'"
            } else {
                r"'SYSTEM: ' ~ c ~ '\n'"
            };
            looped(
                "",
                &format!(
                    "{{%- if r == 'system' -%}}{{{{- {system} -}}}}\
                     {{%- elif r == 'user' -%}}{{{{- 'USER: ' ~ c ~ '\\n' -}}}}\
                     {{%- elif r == 'assistant' -%}}{{{{- 'ASSISTANT: ' ~ c ~ '</s>\\n' -}}}}{{%- endif -%}}"
                ),
                &gen("ASSISTANT:"),
            )
        }
        "deepseek" => looped(
            "",
            r#"{%- if r == 'system' -%}{{- c -}}
               {%- elif r == 'user' -%}{{- '### Instruction:\n' ~ c ~ '\n' -}}
               {%- elif r == 'assistant' -%}{{- '### Response:\n' ~ c ~ '\n<|EOT|>\n' -}}{%- endif -%}"#,
            &gen(r"### Response:\n"),
        ),
        "deepseek2" => looped(
            "",
            r#"{%- if r == 'system' -%}{{- c ~ '\n\n' -}}
               {%- elif r == 'user' -%}{{- 'User: ' ~ c ~ '\n\n' -}}
               {%- elif r == 'assistant' -%}{{- 'Assistant: ' ~ c ~ '<｜end▁of▁sentence｜>' -}}{%- endif -%}"#,
            &gen("Assistant:"),
        ),
        "deepseek3" => looped(
            "",
            r#"{%- if r == 'system' -%}{{- c ~ '\n\n' -}}
               {%- elif r == 'user' -%}{{- '<｜User｜>' ~ c -}}
               {%- elif r == 'assistant' -%}{{- '<｜Assistant｜>' ~ c ~ '<｜end▁of▁sentence｜>' -}}{%- endif -%}"#,
            &gen("<｜Assistant｜>"),
        ),
        "deepseek-ocr" => looped("", "{{- c -}}", ""),
        "command-r" => looped(
            "",
            r#"{%- set tokens = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'} -%}
               {%- if r in tokens -%}{{- '<|START_OF_TURN_TOKEN|>' ~ tokens[r] ~ c|trim(ws) ~ '<|END_OF_TURN_TOKEN|>' -}}{%- endif -%}"#,
            &gen("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
        ),
        "llama3" => looped(
            "",
            r#"{{- '<|start_header_id|>' ~ r ~ '<|end_header_id|>\n\n' ~ c|trim(ws) ~ '<|eot_id|>' -}}"#,
            &gen(r"<|start_header_id|>assistant<|end_header_id|>\n\n"),
        ),
        "chatglm3" => looped(
            "[gMASK]sop",
            r#"{{- '<|' ~ r ~ '|>\n ' ~ c -}}"#,
            &gen("<|assistant|>"),
        ),
        "chatglm4" => looped(
            "[gMASK]<sop>",
            r#"{{- '<|' ~ r ~ '|>\n' ~ c -}}"#,
            &gen(r"<|assistant|>\n"),
        ),
        "glmedge" => looped(
            "",
            r#"{{- '<|' ~ r ~ '|>\n' ~ c -}}"#,
            &gen("<|assistant|>"),
        ),
        "minicpm" => looped(
            "",
            r#"{%- if r == 'user' -%}{{- '<用户>' ~ c|trim(ws) ~ '<AI>' -}}{%- else -%}{{- c|trim(ws) -}}{%- endif -%}"#,
            "",
        ),
        "exaone3" | "exaone4" => {
            let tool = if name == "exaone4" {
                r#"{%- elif r == 'tool' -%}{{- '[|tool|]' ~ c|trim(ws) ~ '[|endofturn|]\n' -}}"#
            } else {
                ""
            };
            looped(
                "",
                &format!(
                    r#"{{%- if r == 'system' -%}}{{{{- '[|system|]' ~ c|trim(ws) ~ '[|endofturn|]\n' -}}}}
                       {{%- elif r == 'user' -%}}{{{{- '[|user|]' ~ c|trim(ws) ~ '\n' -}}}}
                       {{%- elif r == 'assistant' -%}}{{{{- '[|assistant|]' ~ c|trim(ws) ~ '[|endofturn|]\n' -}}}}
                       {tool}{{%- endif -%}}"#
                ),
                &gen("[|assistant|]"),
            )
        }
        "exaone-moe" => looped(
            "",
            r#"{%- if r in ['system', 'user', 'assistant', 'tool'] -%}{{- '<|' ~ r ~ '|>\n' ~ c|trim(ws) ~ '<|endofturn|>\n' -}}{%- endif -%}"#,
            &gen(r"<|assistant|>\n"),
        ),
        "rwkv-world" => looped(
            "",
            r#"{%- if r == 'system' -%}{{- 'System: ' ~ c|trim(ws) ~ '\n\n' -}}
               {%- elif r == 'user' -%}{{- 'User: ' ~ c|trim(ws) ~ '\n\n' -}}{%- if loop.last -%}{{- 'Assistant:' -}}{%- endif -%}
               {%- elif r == 'assistant' -%}{{- 'Assistant: ' ~ c|trim(ws) ~ '\n\n' -}}{%- endif -%}"#,
            "",
        ),
        "granite" => looped(
            "",
            r#"{{- '<|start_of_role|>' ~ r ~ '<|end_of_role|>' -}}
               {%- if r == 'assistant_tool_call' -%}{{- '<|tool_call|>' -}}{%- endif -%}
               {{- c ~ '<|end_of_text|>\n' -}}"#,
            &gen("<|start_of_role|>assistant<|end_of_role|>"),
        ),
        "granite-4.0" | "granite-4.1" => looped(
            "",
            r#"{%- if r == 'assistant_tool_call' -%}{{- '<|start_of_role|>assistant<|end_of_role|><|tool_call|>' -}}
               {%- else -%}{{- '<|start_of_role|>' ~ r ~ '<|end_of_role|>' -}}{%- endif -%}
               {{- c ~ '<|end_of_text|>\n' -}}"#,
            &gen("<|start_of_role|>assistant<|end_of_role|>"),
        ),
        "gigachat" => looped(
            r#"{%- set has_system = messages and messages[0].role == 'system' -%}
               {%- if has_system -%}{{- '<s>' ~ (messages[0].content if messages[0].content is string else '') ~ '<|message_sep|>' -}}
               {%- else -%}{{- '<s>' -}}{%- endif -%}"#,
            r#"{%- if loop.first and has_system -%}
               {%- elif r == 'user' -%}{{- 'user<|role_sep|>' ~ c ~ '<|message_sep|>available functions<|role_sep|>[]<|message_sep|>' -}}
               {%- elif r == 'assistant' -%}{{- 'assistant<|role_sep|>' ~ c ~ '<|message_sep|>' -}}{%- endif -%}"#,
            &gen("assistant<|role_sep|>"),
        ),
        "megrez" => looped(
            "",
            r#"{{- '<|role_start|>' ~ r ~ '<|role_end|>' ~ c ~ '<|turn_end|>' -}}"#,
            &gen("<|role_start|>assistant<|role_end|>"),
        ),
        "yandex" => looped(
            "",
            r#"{%- if r == 'user' -%}{{- ' Пользователь: ' ~ c ~ '\n\n' -}}
               {%- elif r == 'assistant' -%}{{- ' Ассистент: ' ~ c ~ '\n\n' -}}{%- endif -%}"#,
            &gen(" Ассистент:[SEP]"),
        ),
        "bailing" | "bailing-think" => looped(
            "",
            r#"{{- '<role>' ~ ('HUMAN' if r == 'user' else r|upper) ~ '</role>' ~ c -}}"#,
            &gen(if name == "bailing" {
                "<role>ASSISTANT</role>"
            } else {
                "<role>ASSISTANT</role><think>"
            }),
        ),
        "bailing2" => looped(
            r#"{%- if not (messages and messages[0].role == 'system') -%}{{- '<role>SYSTEM</role>detailed thinking off<|role_end|>' -}}{%- endif -%}"#,
            r#"{{- '<role>' ~ ('HUMAN' if r == 'user' else r|upper) ~ '</role>' ~ c ~ '<|role_end|>' -}}"#,
            &gen("<role>ASSISTANT</role>"),
        ),
        "llama4" => looped(
            "",
            r#"{{- '<|header_start|>' ~ r ~ '<|header_end|>\n\n' ~ c|trim(ws) ~ '<|eot|>' -}}"#,
            &gen(r"<|header_start|>assistant<|header_end|>\n\n"),
        ),
        "smolvlm" => looped(
            "<|im_start|>",
            r#"{%- if r == 'system' -%}{{- c ~ '\n\n' -}}
               {%- elif r == 'user' -%}{{- 'User: ' ~ c ~ '<end_of_utterance>\n' -}}
               {%- else -%}{{- 'Assistant: ' ~ c ~ '<end_of_utterance>\n' -}}{%- endif -%}"#,
            &gen("Assistant:"),
        ),
        "hunyuan-moe" => looped(
            "",
            r#"{%- if r == 'system' -%}{{- '<|startoftext|>' ~ c ~ '<|extra_4|>' -}}
               {%- elif r == 'assistant' -%}{{- c ~ '<|eos|>' -}}
               {%- else -%}{{- '<|startoftext|>' ~ c ~ '<|extra_0|>' -}}{%- endif -%}"#,
            "",
        ),
        "gpt-oss" => looped(
            "",
            r#"{{- '<|start|>' ~ r ~ '<|message|>' ~ c ~ ('<|return|>' if r == 'assistant' else '<|end|>') -}}"#,
            &gen("<|start|>assistant"),
        ),
        "hunyuan-dense" => looped(
            "",
            r#"{%- if loop.first and r == 'system' -%}{{- c ~ '<｜hy_place▁holder▁no▁3｜>' -}}{%- endif -%}
               {%- if r == 'assistant' -%}{{- '<｜hy_Assistant｜>' ~ c ~ '<｜hy_place▁holder▁no▁2｜>' -}}
               {%- elif r == 'user' -%}{{- '<｜hy_User｜>' ~ c ~ '<｜hy_Assistant｜>' -}}{%- endif -%}"#,
            "",
        ),
        "hunyuan-vl" => looped(
            "<｜hy_begin▁of▁sentence｜>",
            r#"{%- if loop.first and r == 'system' -%}{{- c ~ '<｜hy_place▁holder▁no▁3｜>' -}}
               {%- elif r == 'user' -%}{{- c ~ '<｜hy_User｜>' -}}
               {%- elif r == 'assistant' -%}{{- c ~ '<｜hy_Assistant｜>' -}}{%- endif -%}"#,
            "",
        ),
        "kimi-k2" => looped(
            "",
            r#"{%- if r == 'system' -%}{{- '<|im_system|>system<|im_middle|>' -}}
               {%- elif r == 'user' -%}{{- '<|im_user|>user<|im_middle|>' -}}
               {%- elif r == 'assistant' -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}
               {%- elif r == 'tool' -%}{{- '<|im_system|>tool<|im_middle|>' -}}{%- endif -%}
               {{- c ~ '<|im_end|>' -}}"#,
            &gen("<|im_assistant|>assistant<|im_middle|>"),
        ),
        "seed_oss" => looped(
            "",
            r#"{{- '<seed:bos>' ~ r ~ '\n' ~ (c|trim(ws) if r == 'assistant' else c) ~ '<seed:eos>' -}}"#,
            &gen(r"<seed:bos>assistant\n"),
        ),
        "grok-2" => looped(
            "",
            r#"{%- if r == 'system' -%}{{- 'System: ' ~ c|trim(ws) ~ '<|separator|>\n\n' -}}
               {%- elif r == 'user' -%}{{- 'Human: ' ~ c|trim(ws) ~ '<|separator|>\n\n' -}}
               {%- elif r == 'assistant' -%}{{- 'Assistant: ' ~ c ~ '<|separator|>\n\n' -}}{%- endif -%}"#,
            &gen("Assistant:"),
        ),
        "pangu-embedded" => looped(
            "",
            r#"{%- if loop.first and r != 'system' -%}{{- '[unused9]系统：[unused10]' -}}{%- endif -%}
               {%- set names = {'system': '系统', 'user': '用户', 'assistant': '助手', 'tool': '工具', 'function': '方法'} -%}
               {%- if r in names -%}{{- '[unused9]' ~ names[r] ~ '：' ~ c ~ '[unused10]' -}}{%- endif -%}"#,
            &gen("[unused9]助手："),
        ),
        "solar-open" => looped(
            "",
            r#"{{- '<|begin|>' ~ r ~ '<|content|>' ~ c ~ '<|end|>' -}}"#,
            &gen("<|begin|>assistant"),
        ),
        _ => return None,
    };
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::super::{ChatTemplate, Message};
    use super::names;

    /// Each template on system, user, assistant, user (with whitespace to trim, or not, around
    /// two of them) and a generation prompt, against the text llama.cpp's C++ builds.
    #[test]
    fn builtins_match_llama_cpp() {
        let chat = [
            Message::new("system", "Be brief."),
            Message::new("user", " Hi! "),
            Message::new("assistant", "Hello.\n"),
            Message::new("user", "Bye"),
        ];
        let cases: &[(&str, &str)] = &[
            ("chatml", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi! <|im_end|>\n<|im_start|>assistant\nHello.\n<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"),
            ("llama2", "[INST] Be brief.\n Hi!  [/INST]Hello.\n</s>[INST] Bye [/INST]"),
            ("llama2-sys", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi!  [/INST]Hello.\n</s>[INST] Bye [/INST]"),
            ("llama2-sys-bos", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi!  [/INST]Hello.\n</s><s>[INST] Bye [/INST]"),
            ("llama2-sys-strip", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST]Hello.</s>[INST] Bye [/INST]"),
            ("mistral-v1", " [INST] Be brief.\n\n Hi!  [/INST] Hello.\n</s> [INST] Bye [/INST]"),
            ("mistral-v3", "[INST] Be brief.\n\n Hi! [/INST] Hello.</s>[INST] Bye[/INST]"),
            ("mistral-v3-tekken", "[INST]Be brief.\n\n Hi! [/INST]Hello.\n</s>[INST]Bye[/INST]"),
            ("mistral-v7", "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST]  Hi! [/INST] Hello.\n</s>[INST] Bye[/INST]"),
            ("mistral-v7-tekken", "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST] Hi! [/INST]Hello.\n</s>[INST]Bye[/INST]"),
            ("phi3", "<|system|>\nBe brief.<|end|>\n<|user|>\n Hi! <|end|>\n<|assistant|>\nHello.\n<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n"),
            ("phi4", "<|im_start|>system<|im_sep|>Be brief.<|im_end|><|im_start|>user<|im_sep|> Hi! <|im_end|><|im_start|>assistant<|im_sep|>Hello.\n<|im_end|><|im_start|>user<|im_sep|>Bye<|im_end|><|im_start|>assistant<|im_sep|>"),
            ("falcon3", "<|system|>\nBe brief.\n<|user|>\n Hi! \n<|assistant|>\nHello.\n\n<|user|>\nBye\n<|assistant|>\n"),
            ("zephyr", "<|system|>\nBe brief.<|endoftext|>\n<|user|>\n Hi! <|endoftext|>\n<|assistant|>\nHello.\n<|endoftext|>\n<|user|>\nBye<|endoftext|>\n<|assistant|>\n"),
            ("monarch", "system\nBe brief.</s>\n<s>user\n Hi! </s>\n<s>assistant\nHello.\n</s>\n<s>user\nBye</s>\n<s>assistant\n"),
            ("gemma", "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"),
            ("orion", "Human: Be brief.\n\n Hi! \n\nAssistant: </s>Hello.\n</s>Human: Bye\n\nAssistant: </s>"),
            ("openchat", "Be brief.<|end_of_turn|>GPT4 Correct User:  Hi! <|end_of_turn|>GPT4 Correct Assistant: Hello.\n<|end_of_turn|>GPT4 Correct User: Bye<|end_of_turn|>GPT4 Correct Assistant:"),
            ("vicuna", "Be brief.\n\nUSER:  Hi! \nASSISTANT: Hello.\n</s>\nUSER: Bye\nASSISTANT:"),
            ("vicuna-orca", "SYSTEM: Be brief.\nUSER:  Hi! \nASSISTANT: Hello.\n</s>\nUSER: Bye\nASSISTANT:"),
            ("deepseek", "Be brief.### Instruction:\n Hi! \n### Response:\nHello.\n\n<|EOT|>\n### Instruction:\nBye\n### Response:\n"),
            ("deepseek2", "Be brief.\n\nUser:  Hi! \n\nAssistant: Hello.\n<｜end▁of▁sentence｜>User: Bye\n\nAssistant:"),
            ("deepseek3", "Be brief.\n\n<｜User｜> Hi! <｜Assistant｜>Hello.\n<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜>"),
            ("deepseek-ocr", "Be brief. Hi! Hello.\nBye"),
            ("command-r", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi!<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Bye<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
            ("llama3", "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
            ("chatglm3", "[gMASK]sop<|system|>\n Be brief.<|user|>\n  Hi! <|assistant|>\n Hello.\n<|user|>\n Bye<|assistant|>"),
            ("chatglm4", "[gMASK]<sop><|system|>\nBe brief.<|user|>\n Hi! <|assistant|>\nHello.\n<|user|>\nBye<|assistant|>\n"),
            ("glmedge", "<|system|>\nBe brief.<|user|>\n Hi! <|assistant|>\nHello.\n<|user|>\nBye<|assistant|>"),
            ("minicpm", "Be brief.<用户>Hi!<AI>Hello.<用户>Bye<AI>"),
            ("exaone3", "[|system|]Be brief.[|endofturn|]\n[|user|]Hi!\n[|assistant|]Hello.[|endofturn|]\n[|user|]Bye\n[|assistant|]"),
            ("exaone4", "[|system|]Be brief.[|endofturn|]\n[|user|]Hi!\n[|assistant|]Hello.[|endofturn|]\n[|user|]Bye\n[|assistant|]"),
            ("exaone-moe", "<|system|>\nBe brief.<|endofturn|>\n<|user|>\nHi!<|endofturn|>\n<|assistant|>\nHello.<|endofturn|>\n<|user|>\nBye<|endofturn|>\n<|assistant|>\n"),
            ("rwkv-world", "System: Be brief.\n\nUser: Hi!\n\nAssistant: Hello.\n\nUser: Bye\n\nAssistant:"),
            ("granite", "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n<|start_of_role|>user<|end_of_role|> Hi! <|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hello.\n<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Bye<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"),
            ("granite-4.0", "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n<|start_of_role|>user<|end_of_role|> Hi! <|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hello.\n<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Bye<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"),
            ("granite-4.1", "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n<|start_of_role|>user<|end_of_role|> Hi! <|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hello.\n<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Bye<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"),
            ("gigachat", "<s>Be brief.<|message_sep|>user<|role_sep|> Hi! <|message_sep|>available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>Hello.\n<|message_sep|>user<|role_sep|>Bye<|message_sep|>available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>"),
            ("megrez", "<|role_start|>system<|role_end|>Be brief.<|turn_end|><|role_start|>user<|role_end|> Hi! <|turn_end|><|role_start|>assistant<|role_end|>Hello.\n<|turn_end|><|role_start|>user<|role_end|>Bye<|turn_end|><|role_start|>assistant<|role_end|>"),
            ("yandex", " Пользователь:  Hi! \n\n Ассистент: Hello.\n\n\n Пользователь: Bye\n\n Ассистент:[SEP]"),
            ("bailing", "<role>SYSTEM</role>Be brief.<role>HUMAN</role> Hi! <role>ASSISTANT</role>Hello.\n<role>HUMAN</role>Bye<role>ASSISTANT</role>"),
            ("bailing-think", "<role>SYSTEM</role>Be brief.<role>HUMAN</role> Hi! <role>ASSISTANT</role>Hello.\n<role>HUMAN</role>Bye<role>ASSISTANT</role><think>"),
            ("bailing2", "<role>SYSTEM</role>Be brief.<|role_end|><role>HUMAN</role> Hi! <|role_end|><role>ASSISTANT</role>Hello.\n<|role_end|><role>HUMAN</role>Bye<|role_end|><role>ASSISTANT</role>"),
            ("llama4", "<|header_start|>system<|header_end|>\n\nBe brief.<|eot|><|header_start|>user<|header_end|>\n\nHi!<|eot|><|header_start|>assistant<|header_end|>\n\nHello.<|eot|><|header_start|>user<|header_end|>\n\nBye<|eot|><|header_start|>assistant<|header_end|>\n\n"),
            ("smolvlm", "<|im_start|>Be brief.\n\nUser:  Hi! <end_of_utterance>\nAssistant: Hello.\n<end_of_utterance>\nUser: Bye<end_of_utterance>\nAssistant:"),
            ("hunyuan-moe", "<|startoftext|>Be brief.<|extra_4|><|startoftext|> Hi! <|extra_0|>Hello.\n<|eos|><|startoftext|>Bye<|extra_0|>"),
            ("gpt-oss", "<|start|>system<|message|>Be brief.<|end|><|start|>user<|message|> Hi! <|end|><|start|>assistant<|message|>Hello.\n<|return|><|start|>user<|message|>Bye<|end|><|start|>assistant"),
            ("hunyuan-dense", "Be brief.<｜hy_place▁holder▁no▁3｜><｜hy_User｜> Hi! <｜hy_Assistant｜><｜hy_Assistant｜>Hello.\n<｜hy_place▁holder▁no▁2｜><｜hy_User｜>Bye<｜hy_Assistant｜>"),
            ("hunyuan-vl", "<｜hy_begin▁of▁sentence｜>Be brief.<｜hy_place▁holder▁no▁3｜> Hi! <｜hy_User｜>Hello.\n<｜hy_Assistant｜>Bye<｜hy_User｜>"),
            ("kimi-k2", "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|> Hi! <|im_end|><|im_assistant|>assistant<|im_middle|>Hello.\n<|im_end|><|im_user|>user<|im_middle|>Bye<|im_end|><|im_assistant|>assistant<|im_middle|>"),
            ("seed_oss", "<seed:bos>system\nBe brief.<seed:eos><seed:bos>user\n Hi! <seed:eos><seed:bos>assistant\nHello.<seed:eos><seed:bos>user\nBye<seed:eos><seed:bos>assistant\n"),
            ("grok-2", "System: Be brief.<|separator|>\n\nHuman: Hi!<|separator|>\n\nAssistant: Hello.\n<|separator|>\n\nHuman: Bye<|separator|>\n\nAssistant:"),
            ("pangu-embedded", "[unused9]系统：Be brief.[unused10][unused9]用户： Hi! [unused10][unused9]助手：Hello.\n[unused10][unused9]用户：Bye[unused10][unused9]助手："),
            ("solar-open", "<|begin|>system<|content|>Be brief.<|end|><|begin|>user<|content|> Hi! <|end|><|begin|>assistant<|content|>Hello.\n<|end|><|begin|>user<|content|>Bye<|end|><|begin|>assistant"),
        ];
        let mut covered: Vec<&str> = cases.iter().map(|c| c.0).collect();
        covered.sort_unstable();
        assert_eq!(covered, names(), "every built-in has a case");
        for (name, want) in cases {
            let t = ChatTemplate::builtin(name, "<s>", "</s>").unwrap();
            assert!(t.is_reviewed(), "{name}");
            assert_eq!(&t.render(&chat, true).unwrap(), want, "{name}");
        }
    }

    /// Without a system message, and without a generation prompt.
    #[test]
    fn builtins_without_a_system_message() {
        let chat = [Message::new("user", "Hi"), Message::new("assistant", "Yo")];
        let cases: &[(&str, &str)] = &[
            ("bailing2", "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>Yo<|role_end|>"),
            ("pangu-embedded", "[unused9]系统：[unused10][unused9]用户：Hi[unused10][unused9]助手：Yo[unused10]"),
            ("gigachat", "<s>user<|role_sep|>Hi<|message_sep|>available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>Yo<|message_sep|>"),
            ("rwkv-world", "User: Hi\n\nAssistant: Yo\n\n"),
            ("hunyuan-dense", "<｜hy_User｜>Hi<｜hy_Assistant｜><｜hy_Assistant｜>Yo<｜hy_place▁holder▁no▁2｜>"),
            ("llama3", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>"),
            ("gemma", "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nYo<end_of_turn>\n"),
            ("monarch", "user\nHi</s>\n<s>assistant\nYo</s>\n"),
        ];
        for (name, want) in cases {
            let t = ChatTemplate::builtin(name, "", "").unwrap();
            assert_eq!(&t.render(&chat, false).unwrap(), want, "{name}");
        }
        assert!(ChatTemplate::builtin("nope", "", "").is_none());
        let mut sorted = names().to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, names());
    }
}
