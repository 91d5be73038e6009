//! The guides' kubectl commands, run as a reader copies them from the page.
//!
//! Every `kubectl` command in a guide's `sh` blocks is loaded as written (continuation lines
//! joined) and run by `bash -c` with the built kubectl first on PATH, from a working directory
//! holding copies of `examples/` and `deploy/`. The test changes those copies where a reader here
//! must (an endpoint, a replica count; each change asserts the text it replaces is still there),
//! and `HOME` holds the host's client files where the libvirt guide's step 1 leaves them. At the
//! end, every command was run or is named with the reason it cannot run here.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use banlieue_testenv::control_plane::bin_dir;

use super::Result;

/// One command of a guide: where it is and its text.
#[derive(Debug)]
struct GuideCommand {
    at: String,
    text: String,
    ran: bool,
}

/// The commands of some guides and the directory a reader runs them from.
pub struct Guides {
    commands: Vec<GuideCommand>,
    workdir: tempfile::TempDir,
}

impl Guides {
    /// Loads every kubectl command of `guides` (paths relative to the repository) and makes the
    /// reader's working directory and home.
    pub fn load(repo: &Path, guides: &[&str]) -> Result<Self> {
        let mut commands = Vec::new();
        for guide in guides {
            let text = std::fs::read_to_string(repo.join(guide))?;
            for (line, command) in shell_commands(&text) {
                if command.starts_with("kubectl ") {
                    commands.push(GuideCommand {
                        at: format!("{guide}:{line}"),
                        text: command,
                        ran: false,
                    });
                }
            }
        }
        let workdir = tempfile::tempdir()?;
        for dir in ["examples", "deploy"] {
            copy_tree(&repo.join(dir), &workdir.path().join(dir))?;
        }
        std::fs::create_dir_all(workdir.path().join("home"))?;
        Ok(Self { commands, workdir })
    }

    /// The reader's home directory.
    pub fn home(&self) -> PathBuf {
        self.workdir.path().join("home")
    }

    /// Replaces `from` by `to` in the reader's copy of `file` (`examples/…` or `deploy/…`).
    pub fn substitute(&self, file: &str, from: &str, to: &str) -> Result {
        let path = self.workdir.path().join(file);
        let text = std::fs::read_to_string(&path)?;
        if !text.contains(from) {
            return Err(format!("{file} no longer contains {from:?}").into());
        }
        std::fs::write(&path, text.replace(from, to))?;
        Ok(())
    }

    /// Runs the first command not run yet that starts with `prefix`, as the identity of
    /// `kubeconfig`; returns its standard output, or an error with its standard error (and the
    /// command stays to be run again).
    pub fn run(&mut self, kubeconfig: &Path, prefix: &str) -> Result<String> {
        let index = self.next(prefix)?;
        let text = self.commands[index].text.clone();
        let out = self.command(kubeconfig, &text).output()?;
        if !out.status.success() {
            return Err(format!(
                "{}: `{text}` failed: {}",
                self.commands[index].at,
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        self.commands[index].ran = true;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs the one command not run yet that starts with `prefix`, a watch (`-w`) or a follow
    /// (`-f`) that does not end by itself, until a line of its output contains `until`; then
    /// stops it, as a reader would with Ctrl-C. Returns the output seen.
    pub async fn watch(
        &mut self,
        kubeconfig: &Path,
        prefix: &str,
        until: &str,
        secs: u64,
    ) -> Result<String> {
        let index = self.next(prefix)?;
        self.commands[index].ran = true;
        let (at, text) = (
            self.commands[index].at.clone(),
            self.commands[index].text.clone(),
        );
        let mut child = self
            .command(kubeconfig, &format!("exec {text}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("stdout")?;
        let until = until.to_owned();
        let deadline = Instant::now() + Duration::from_secs(secs);
        let reader = tokio::task::spawn_blocking(move || {
            let mut seen = String::new();
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                seen.push_str(&line);
                seen.push('\n');
                if line.contains(&until) {
                    return (true, seen);
                }
            }
            (false, seen)
        });
        // The reader ends when its line comes or when the command exits; the deadline kills the
        // command, which closes its output and so ends the reader too.
        let pid = child.id();
        let timer = tokio::spawn(async move {
            tokio::time::sleep_until(deadline.into()).await;
            let _ = Command::new("kill").arg(pid.to_string()).status();
        });
        let (found, seen) = reader.await?;
        timer.abort();
        let _ = child.kill();
        let _ = child.wait();
        if found {
            return Ok(seen);
        }
        let mut errors = String::new();
        if let Some(mut stderr) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut stderr, &mut errors);
        }
        Err(
            format!("{at}: `{text}` never printed the expected line; it printed:\n{seen}{errors}")
                .into(),
        )
    }

    /// Commands neither run nor in `not_here` (prefix, why it cannot run here).
    pub fn not_run(&self, not_here: &[(&str, &str)]) -> Vec<String> {
        self.commands
            .iter()
            .filter(|c| !c.ran && !not_here.iter().any(|(p, _)| c.text.starts_with(p)))
            .map(|c| format!("{}: {}", c.at, c.text))
            .collect()
    }

    fn next(&self, prefix: &str) -> Result<usize> {
        self.commands
            .iter()
            .position(|c| !c.ran && c.text.starts_with(prefix))
            .ok_or_else(|| format!("no guide command left that starts with `{prefix}`").into())
    }

    fn command(&self, kubeconfig: &Path, text: &str) -> Command {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![bin_dir()];
        paths.extend(std::env::split_paths(&path));
        let mut command = Command::new("bash");
        command
            .args(["-c", text])
            .current_dir(self.workdir.path())
            .env("PATH", std::env::join_paths(paths).unwrap_or(path))
            .env("HOME", self.home())
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null());
        command
    }
}

/// The first fenced yaml block of `guide` that contains `needle`.
pub fn yaml_block(repo: &Path, guide: &str, needle: &str) -> Result<String> {
    let text = std::fs::read_to_string(repo.join(guide))?;
    fenced(&text, &["yaml"])
        .into_iter()
        .map(|(_, lines)| lines.join("\n"))
        .find(|block| block.contains(needle))
        .ok_or_else(|| format!("{guide} has no yaml block with {needle:?}").into())
}

/// (line, command) of every logical command of the `sh` blocks: continuations joined, blank
/// and comment lines dropped.
fn shell_commands(text: &str) -> Vec<(usize, String)> {
    let mut commands = Vec::new();
    for (start, lines) in fenced(text, &["sh", "bash", "shell"]) {
        let mut pending: Option<(usize, String)> = None;
        for (offset, line) in lines.iter().enumerate() {
            let trimmed = line.trim();
            let (line_number, mut joined) = match pending.take() {
                Some((n, before)) => (n, format!("{before} {trimmed}")),
                None if trimmed.is_empty() || trimmed.starts_with('#') => continue,
                None => (start + offset, trimmed.to_owned()),
            };
            if let Some(head) = joined.strip_suffix('\\') {
                joined = head.trim_end().to_owned();
                pending = Some((line_number, joined));
            } else {
                commands.push((line_number, joined));
            }
        }
    }
    commands
}

/// (first line number, lines) of each fenced block in one of `languages`.
fn fenced<'a>(text: &'a str, languages: &[&str]) -> Vec<(usize, Vec<&'a str>)> {
    let mut blocks = Vec::new();
    let mut open: Option<(bool, usize, Vec<&str>)> = None;
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        match open.take() {
            None => {
                if let Some(language) = trimmed.strip_prefix("```") {
                    open = Some((languages.contains(&language.trim()), number + 2, Vec::new()));
                }
            }
            Some((wanted, start, lines)) if trimmed == "```" => {
                if wanted {
                    blocks.push((start, lines));
                }
            }
            Some((wanted, start, mut lines)) => {
                lines.push(line);
                open = Some((wanted, start, lines));
            }
        }
    }
    blocks
}

fn copy_tree(from: &Path, to: &Path) -> Result {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            // The Helm chart's files/ link into deploy/: relative links, kept as links.
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_joined_and_comments_dropped() {
        let text = "intro\n```sh\n# a comment\nkubectl -n x create secret a \\\n  --from-file=b=c\n\nkubectl get y -w\n```\n```yaml\nkind: Z\n```\n";
        assert_eq!(
            shell_commands(text),
            vec![
                (4, "kubectl -n x create secret a --from-file=b=c".to_owned()),
                (7, "kubectl get y -w".to_owned()),
            ]
        );
        assert_eq!(fenced(text, &["yaml"]), vec![(10, vec!["kind: Z"])]);
    }
}
