//! `smbdirectd user add|remove|list`: the local user store file
//! (`smbdirect_controlplane::users`, format in its docs). Passwords come
//! from standard input only, never from the command line (where `ps` and
//! shell history would show them): one line when piped, or typed twice
//! without echo at a terminal.
//!
//! Exit status: 0 done; 1 the operation failed (user exists, no such user,
//! unreadable or malformed file, write error); 2 usage (bad name, empty or
//! mismatched password, no password on standard input).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use smbdirect_controlplane::users::{self, UserStore, UserStoreError};

/// `smbdirectd user ...`.
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user. The password is read from standard input: one line when
    /// piped; prompted twice, without echo, at a terminal.
    Add {
        /// User name (compared ignoring case).
        name: String,
        /// The user store file (created, mode 0600, if missing).
        #[arg(long, value_name = "FILE")]
        users: PathBuf,
    },
    /// Remove a user.
    Remove {
        /// User name (compared ignoring case).
        name: String,
        /// The user store file.
        #[arg(long, value_name = "FILE")]
        users: PathBuf,
    },
    /// List the users, one per line.
    List {
        /// The user store file.
        #[arg(long, value_name = "FILE")]
        users: PathBuf,
    },
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("smbdirectd: {e}");
    ExitCode::FAILURE
}

fn usage(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("smbdirectd: {e}");
    ExitCode::from(2)
}

/// Maps a store error to its exit status.
fn store_error(e: UserStoreError) -> ExitCode {
    match e {
        UserStoreError::InvalidName { .. } | UserStoreError::EmptyPassword => usage(e),
        _ => fail(e),
    }
}

fn load(path: PathBuf, create: bool) -> Result<UserStore, ExitCode> {
    let r = if create {
        UserStore::load_or_new(path)
    } else {
        UserStore::load(path)
    };
    let store = r.map_err(store_error)?;
    for w in store.warnings() {
        eprintln!("smbdirectd: warning: {w}");
    }
    Ok(store)
}

/// The password: prompted twice at a terminal, else one line of stdin.
fn read_password(name: &str) -> Result<String, ExitCode> {
    let io = |e: std::io::Error| fail(format!("cannot read the password: {e}"));
    if users::stdin_is_tty() {
        let first = users::read_password_no_echo(&format!("Password for {name}: ")).map_err(io)?;
        let again = users::read_password_no_echo("Again: ").map_err(io)?;
        match (first, again) {
            (Some(a), Some(b)) if a == b => Ok(a),
            (Some(_), Some(_)) => Err(usage("the passwords differ")),
            _ => Err(usage("no password entered")),
        }
    } else {
        users::read_line(&mut std::io::stdin().lock())
            .map_err(io)?
            .ok_or_else(|| {
                usage("no password on standard input (pipe one line, or run at a terminal)")
            })
    }
}

/// Runs one `user` subcommand.
pub fn run(cmd: UserCommand) -> ExitCode {
    let r = match cmd {
        UserCommand::Add { name, users } => add(&name, users),
        UserCommand::Remove { name, users } => remove(&name, users),
        UserCommand::List { users } => list(users),
    };
    r.unwrap_or_else(|code| code)
}

fn add(name: &str, path: PathBuf) -> Result<ExitCode, ExitCode> {
    // Refuse a bad name or an existing user before asking for a password.
    users::validate_name(name).map_err(store_error)?;
    let mut store = load(path, true)?;
    if store.get(name).is_some() {
        return Err(store_error(UserStoreError::Exists(name.to_string())));
    }
    let password = read_password(name)?;
    store.add(name, &password).map_err(store_error)?;
    store.save().map_err(store_error)?;
    println!(
        "smbdirectd: added user '{name}' to {}",
        store.path().display()
    );
    Ok(ExitCode::SUCCESS)
}

fn remove(name: &str, path: PathBuf) -> Result<ExitCode, ExitCode> {
    let mut store = load(path, false)?;
    let gone = store.remove(name).map_err(store_error)?;
    store.save().map_err(store_error)?;
    println!(
        "smbdirectd: removed user '{}' from {}",
        gone.name,
        store.path().display()
    );
    Ok(ExitCode::SUCCESS)
}

fn list(path: PathBuf) -> Result<ExitCode, ExitCode> {
    let store = load(path, false)?;
    for u in store.list() {
        if u.disabled() {
            println!("{} (disabled)", u.name);
        } else {
            println!("{}", u.name);
        }
    }
    Ok(ExitCode::SUCCESS)
}
