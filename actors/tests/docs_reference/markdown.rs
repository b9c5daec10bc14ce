//! The parts of a Markdown page the fact checks read: fenced code blocks,
//! inline code spans and table rows, each with the line it starts on.

use std::path::PathBuf;

/// One fenced code block.
pub struct CodeBlock {
    /// The info string's first word (`sh`, `yaml`, or empty).
    pub lang: String,
    /// 1-based line of the opening fence.
    pub line: usize,
    /// The block's lines, each with its 1-based line number, de-indented
    /// like the fence (blocks inside list items).
    pub lines: Vec<(usize, String)>,
}

impl CodeBlock {
    pub fn text(&self) -> String {
        self.lines.iter().map(|(_, l)| format!("{l}\n")).collect()
    }
}

/// One page, split into what the checks read.
pub struct Page {
    /// Relative to the repository root, for messages.
    pub path: PathBuf,
    pub blocks: Vec<CodeBlock>,
    /// Inline code spans outside code blocks: (line, text).
    pub spans: Vec<(usize, String)>,
    /// Table rows outside code blocks: (line, cells as written).
    pub rows: Vec<(usize, Vec<String>)>,
    /// Headings: (line, text without the `#`s).
    pub headings: Vec<(usize, String)>,
}

impl Page {
    /// The text of the last heading above `line`.
    pub fn heading_above(&self, line: usize) -> &str {
        self.headings
            .iter()
            .rev()
            .find(|(at, _)| *at < line)
            .map_or("", |(_, text)| text.as_str())
    }
}

pub use super::doc_blocks::repo_root;

/// README.md, CHANGELOG.md (when present) and every Markdown file under
/// docs/, in a stable order (the pages the doc runners read).
pub fn user_docs() -> Vec<Page> {
    let root = repo_root();
    super::doc_blocks::user_docs()
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file).expect("a readable doc");
            let path = file.strip_prefix(&root).unwrap_or(file).to_path_buf();
            parse(path, &text)
        })
        .collect()
}

pub fn parse(path: PathBuf, text: &str) -> Page {
    let lines: Vec<&str> = text.lines().collect();
    let mut page = Page {
        path,
        blocks: Vec::new(),
        spans: Vec::new(),
        rows: Vec::new(),
        headings: Vec::new(),
    };
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if let Some(fence) = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f)) {
            let indent = lines[i].len() - trimmed.len();
            let lang = trimmed.trim_start_matches(['`', '~']).split_whitespace().next();
            let mut block = CodeBlock {
                lang: lang.unwrap_or("").to_owned(),
                line: i + 1,
                lines: Vec::new(),
            };
            i += 1;
            while i < lines.len() && !lines[i].trim_start().starts_with(fence) {
                let line = lines[i];
                let strip = indent.min(line.len() - line.trim_start_matches(' ').len());
                block.lines.push((i + 1, line[strip..].to_owned()));
                i += 1;
            }
            page.blocks.push(block);
            i += 1;
            continue;
        }
        for span in code_spans(lines[i]) {
            page.spans.push((i + 1, span.to_owned()));
        }
        if trimmed.starts_with('#') {
            page.headings
                .push((i + 1, trimmed.trim_start_matches('#').trim().to_owned()));
        }
        if trimmed.starts_with('|') {
            page.rows.push((i + 1, cells(trimmed)));
        }
        i += 1;
    }
    page
}

/// The single-backtick code spans of one line.
pub fn code_spans(line: &str) -> Vec<&str> {
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(open) = rest.find('`') {
        let run = rest[open..].len() - rest[open..].trim_start_matches('`').len();
        let after = &rest[open + run..];
        let fence = &rest[open..open + run];
        let Some(close) = after.find(fence) else { break };
        spans.push(after[..close].trim());
        rest = &after[close + run..];
    }
    spans
}

/// The cells of a table row (`\|` inside a cell stays in it).
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                chars.next();
                cells.last_mut().expect("one cell at least").push('|');
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().expect("one cell at least").push(c),
        }
    }
    cells.into_iter().map(|c| c.trim().to_owned()).collect()
}

#[test]
fn spans_blocks_and_rows_are_found_with_their_lines() {
    let page = parse(
        "p.md".into(),
        "intro `a` and ``b ` c``\n\n- item\n  ```sh\n  run x\n  ```\n| `--x` | y \\| z |\n",
    );
    assert_eq!(
        page.spans,
        [
            (1, "a".to_owned()),
            (1, "b ` c".to_owned()),
            (7, "--x".to_owned())
        ]
    );
    assert_eq!(page.blocks.len(), 1);
    assert_eq!((page.blocks[0].line, page.blocks[0].lang.as_str()), (4, "sh"));
    assert_eq!(page.blocks[0].lines, [(5, "run x".to_owned())]);
    assert_eq!(page.rows, [(7, vec!["`--x`".to_owned(), "y | z".to_owned()])]);
}
