//! PostgreSQL servers a test starts itself (beside pgrx's shared test cluster): for what
//! needs a server of its own — a standby, pg_upgrade between majors, a special environment.
//! Each has its own directory under /tmp, owned by the postgres user (servers refuse to run
//! as root), a free port on 127.0.0.1, and trust authentication; dropping it stops the
//! server and removes the directory.

use super::Client;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The directory of the PostgreSQL programs for `major`, as pgrx was told (`cargo pgrx init`).
pub fn bindir(major: u16) -> PathBuf {
    let pgrx = pgrx_pg_config::Pgrx::from_config().expect("pgrx is configured (scripts/setup.sh)");
    pgrx.get(&format!("pg{major}")).and_then(|c| c.bin_dir()).expect("a pg_config for that major")
}

/// The major these tests were built for.
pub fn this_major() -> u16 {
    if cfg!(feature = "pg15") {
        15
    } else if cfg!(feature = "pg18") {
        18
    } else {
        17
    }
}

pub struct Server {
    pub bindir: PathBuf,
    pub dir: PathBuf,
    pub port: u16,
    env: Vec<(String, String)>,
}

impl Server {
    /// A new cluster (initdb) of the programs in `bindir`, not started, with `conf` appended
    /// to its postgresql.conf.
    pub fn init(bindir: &Path, conf: &[&str]) -> Server {
        Server::init_with(bindir, &[], conf)
    }

    /// `init`, with more initdb arguments.
    pub fn init_with(bindir: &Path, initdb: &[&str], conf: &[&str]) -> Server {
        let server = Server::empty(bindir);
        let data = server.data();
        let mut args = vec!["-D", &data, "-A", "trust", "-U", "postgres", "--no-instructions"];
        args.extend(initdb);
        server.run_ok("initdb", &args);
        server.configure(conf);
        server
    }

    /// A standby of `primary` (running): `pg_basebackup -R` into a new directory, not started.
    pub fn standby_of(primary: &Server, conf: &[&str]) -> Server {
        let server = Server::empty(&primary.bindir);
        let port = primary.port.to_string();
        server.run_ok(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                &server.data(),
                "-R",
                "-X",
                "stream",
                "--checkpoint=fast",
            ],
        );
        server.configure(conf);
        server
    }

    /// A started server of this test binary's major with the library preloaded and the
    /// extension created in database `postgres`, for tests that drive it from outside (other
    /// languages' clients, PgBouncer, postgres_exporter) or restart it. `conf` is appended.
    pub fn with_pgqueue(conf: &[&str]) -> Server {
        // pgrx's harness installs the extension into the trees before its cluster starts.
        drop(super::connect());
        let mut all = vec!["shared_preload_libraries = 'pgqueue'", "max_connections = 200"];
        all.extend(conf);
        let server = Server::init(&bindir(this_major()), &all);
        server.start();
        server.connect("postgres").batch_execute("CREATE EXTENSION pgqueue").unwrap();
        server
    }

    /// A libpq connection string (also a URI-free form psycopg, node-postgres and lib/pq read).
    pub fn dsn(&self, dbname: &str) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname={dbname}", self.port)
    }

    /// A `postgresql://` URI for `dbname`.
    pub fn url(&self, dbname: &str) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/{dbname}", self.port)
    }

    /// `pg_ctl restart -m fast`: every session ends, the shared memory starts empty.
    pub fn restart(&self) {
        let log = format!("{}/server.log", self.dir.display());
        self.run_ok("pg_ctl", &["-D", &self.data(), "-l", &log, "-m", "fast", "-w", "-t", "60", "restart"]);
    }

    /// The command line that restarts this server (for a test driver in another language).
    pub fn restart_command(&self) -> String {
        let log = format!("{}/server.log", self.dir.display());
        let pg_ctl = self.bindir.join("pg_ctl");
        let cmd = format!("{} -D {} -l {log} -m fast -w -t 60 restart", pg_ctl.display(), self.data());
        if is_root() { format!("sudo -u postgres {cmd}") } else { cmd }
    }

    fn empty(bindir: &Path) -> Server {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = PathBuf::from(format!(
            "/tmp/pgqueue-server-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        if is_root() {
            let status = Command::new("chown").arg("postgres:").arg(&dir).status().unwrap();
            assert!(status.success(), "chown {dir:?} to postgres");
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Server { bindir: bindir.to_path_buf(), dir, port, env: vec![] }
    }

    /// Appends settings; the port and sockets are always this server's own (later lines win).
    pub fn configure(&self, conf: &[&str]) {
        let mut text = format!(
            "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n",
            self.port,
            self.dir.display()
        );
        for line in conf {
            text.push_str(line);
            text.push('\n');
        }
        let path = format!("{}/postgresql.conf", self.data());
        let mut old = std::fs::read_to_string(&path).unwrap();
        old.push_str(&text);
        std::fs::write(&path, old).unwrap();
    }

    /// An environment variable for the server process (set before `start`).
    pub fn env(mut self, name: &str, value: &str) -> Server {
        self.env.push((name.into(), value.into()));
        self
    }

    pub fn data(&self) -> String {
        format!("{}/data", self.dir.display())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn start(&self) {
        let log = format!("{}/server.log", self.dir.display());
        self.run_ok("pg_ctl", &["-D", &self.data(), "-l", &log, "-w", "-t", "60", "start"]);
    }

    pub fn stop(&self) {
        self.run_ok("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "-t", "60", "stop"]);
    }

    pub fn connect(&self, dbname: &str) -> Client {
        self.connect_as("postgres", dbname)
    }

    pub fn connect_as(&self, user: &str, dbname: &str) -> Client {
        postgres::Config::new()
            .host("127.0.0.1")
            .port(self.port)
            .user(user)
            .dbname(dbname)
            .connect(postgres::NoTls)
            .unwrap_or_else(|e| panic!("connect to {dbname} on port {}: {e}\n{}", self.port, self.log()))
    }

    /// Runs one of the server's programs as the postgres user, with PGHOST and PGPORT set to
    /// this server, from its directory.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        let mut env: Vec<String> = vec![format!("PGHOST={}", self.dir.display()), format!("PGPORT={}", self.port)];
        env.extend(self.env.iter().map(|(k, v)| format!("{k}={v}")));
        let path = self.bindir.join(program);
        let mut command = if is_root() {
            let mut c = Command::new("sudo");
            c.args(["-u", "postgres", "env"]);
            c
        } else {
            Command::new("env")
        };
        command.args(&env).arg(&path).args(args).current_dir(&self.dir);
        command.output().unwrap_or_else(|e| panic!("run {path:?}: {e}"))
    }

    /// `run`, failing the test (with its output and the server log) unless it succeeds.
    pub fn run_ok(&self, program: &str, args: &[&str]) -> String {
        let out = self.run(program, args);
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}\n{}\n--- server log ---\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "-w", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn is_root() -> bool {
    // SAFETY: a plain syscall without arguments.
    unsafe { libc::geteuid() == 0 }
}
