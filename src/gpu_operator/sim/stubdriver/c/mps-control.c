/*
 * gpu-operator SIMULATED nvidia-cuda-mps-control and nvidia-cuda-mps-server (one program; what
 * it does depends on the name it runs under). Not NVIDIA software.
 *
 *     nvidia-cuda-mps-control -d   start the control daemon; returns once it listens
 *     nvidia-cuda-mps-control      send each line of stdin to the daemon, print its answers
 *     nvidia-cuda-mps-server       refuses: the stand-in daemon starts no servers
 *
 * Commands, as NVIDIA's daemon takes them:
 *     set_default_active_thread_percentage <0-100>    get_default_active_thread_percentage
 *     set_default_device_pinned_mem_limit <dev> <n>M|G    get_default_device_pinned_mem_limit <dev>
 *     get_server_list    quit
 * where <dev> is a GPU UUID or an index into CUDA_VISIBLE_DEVICES as the daemon was started with.
 *
 * The daemon listens on the UNIX socket "control" in $CUDA_MPS_PIPE_DIRECTORY (/tmp/nvidia-mps
 * without it), writes its pid to nvidia-cuda-mps-control.pid there and logs to control.log in
 * $CUDA_MPS_LOG_DIRECTORY (/var/log/nvidia-mps). Its settings are also written, after each
 * change, to gpu-operator-sim-mps in the pipe directory ("pid N", "thread_percentage P",
 * "pinned_mem_limit UUID LIMIT" lines), for a test to read from the host. SIGTERM or quit stops
 * it and removes the socket, the pid file and that state file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVICES 64
#define LINE 512

static char pipe_dir[256], log_dir[256];
static char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static char devices[MAX_DEVICES][96];
static char limits[MAX_DEVICES][32];
static int device_count;
static char thread_percentage[16] = "100.0";
static volatile sig_atomic_t stopping;

static void dirs(void) {
    const char *p = getenv("CUDA_MPS_PIPE_DIRECTORY");
    const char *l = getenv("CUDA_MPS_LOG_DIRECTORY");
    snprintf(pipe_dir, sizeof pipe_dir, "%s", p && *p ? p : "/tmp/nvidia-mps");
    snprintf(log_dir, sizeof log_dir, "%s", l && *l ? l : "/var/log/nvidia-mps");
    if (snprintf(socket_path, sizeof socket_path, "%s/control", pipe_dir) >=
        (int)sizeof socket_path) {
        fprintf(stderr, "SIMULATED MPS: pipe directory path too long: %s\n", pipe_dir);
        exit(1);
    }
}

static void say(const char *format, ...) {
    char path[300];
    snprintf(path, sizeof path, "%s/control.log", log_dir);
    FILE *f = fopen(path, "a");
    if (!f)
        return;
    time_t now = time(NULL);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", localtime(&now));
    fprintf(f, "[%s] SIMULATED ", stamp);
    va_list args;
    va_start(args, format);
    vfprintf(f, format, args);
    va_end(args);
    fputc('\n', f);
    fclose(f);
}

static void save_state(void) {
    char path[300], tmp[310];
    snprintf(path, sizeof path, "%s/gpu-operator-sim-mps", pipe_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "pid %d\nthread_percentage %s\n", (int)getpid(), thread_percentage);
    for (int i = 0; i < device_count; i++)
        if (limits[i][0])
            fprintf(f, "pinned_mem_limit %s %s\n", devices[i], limits[i]);
    fclose(f);
    rename(tmp, path);
}

static void read_devices(void) {
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    char copy[MAX_DEVICES * 96];
    snprintf(copy, sizeof copy, "%s", visible ? visible : "");
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok && device_count < MAX_DEVICES;
         tok = strtok_r(NULL, ",", &save))
        snprintf(devices[device_count++], sizeof devices[0], "%s", tok);
}

/* The index of a device named by UUID or by its index in CUDA_VISIBLE_DEVICES, or -1. */
static int device_index(const char *name) {
    for (int i = 0; i < device_count; i++)
        if (strcmp(devices[i], name) == 0)
            return i;
    char *end;
    long index = strtol(name, &end, 10);
    if (*name && !*end && index >= 0 && index < device_count)
        return (int)index;
    return -1;
}

static int valid_limit(const char *value) {
    char *end;
    long n = strtol(value, &end, 10);
    return end != value && n > 0 && (strcmp(end, "M") == 0 || strcmp(end, "G") == 0);
}

/* One command's answer into out (a line, or empty); returns 1 when the daemon is to stop. */
static int handle(char *line, char *out, size_t size) {
    char *words[4] = {0};
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save); tok && n < 4;
         tok = strtok_r(NULL, " \t\r\n", &save))
        words[n++] = tok;
    out[0] = '\0';
    if (n == 0)
        return 0;
    if (strcmp(words[0], "quit") == 0 && n == 1) {
        say("quit");
        return 1;
    }
    if (strcmp(words[0], "get_default_active_thread_percentage") == 0 && n == 1) {
        snprintf(out, size, "%s\n", thread_percentage);
    } else if (strcmp(words[0], "set_default_active_thread_percentage") == 0 && n == 2) {
        char *end;
        double p = strtod(words[1], &end);
        if (end == words[1] || *end || p < 0 || p > 100) {
            snprintf(out, size, "Invalid active thread percentage %s\n", words[1]);
            return 0;
        }
        snprintf(thread_percentage, sizeof thread_percentage, "%.1f", p);
        snprintf(out, size, "%s\n", thread_percentage);
        say("set_default_active_thread_percentage %s", thread_percentage);
        save_state();
    } else if (strcmp(words[0], "set_default_device_pinned_mem_limit") == 0 && n == 3) {
        int i = device_index(words[1]);
        if (i < 0 || !valid_limit(words[2])) {
            snprintf(out, size, "Invalid device or limit: %s %s\n", words[1], words[2]);
            return 0;
        }
        snprintf(limits[i], sizeof limits[0], "%s", words[2]);
        say("set_default_device_pinned_mem_limit %s %s", devices[i], limits[i]);
        save_state();
    } else if (strcmp(words[0], "get_default_device_pinned_mem_limit") == 0 && n == 2) {
        int i = device_index(words[1]);
        if (i < 0)
            snprintf(out, size, "Invalid device %s\n", words[1]);
        else
            snprintf(out, size, "%s\n", limits[i][0] ? limits[i] : "0");
    } else if (strcmp(words[0], "get_server_list") == 0 && n == 1) {
        /* no servers: no client ever connects to the stand-in */
    } else {
        snprintf(out, size, "Unknown command or wrong arguments: %s\n", words[0]);
    }
    return 0;
}

static void on_term(int sig) {
    (void)sig;
    stopping = 1;
}

static int write_pid(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/nvidia-cuda-mps-control.pid", pipe_dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "%d\n", (int)getpid());
    return fclose(f);
}

static void cleanup(void) {
    char path[300];
    unlink(socket_path);
    snprintf(path, sizeof path, "%s/nvidia-cuda-mps-control.pid", pipe_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/gpu-operator-sim-mps", pipe_dir);
    unlink(path);
    say("control daemon stopped");
}

static int serve(int listener) {
    struct sigaction term = {.sa_handler = on_term};
    sigaction(SIGTERM, &term, NULL);
    sigaction(SIGINT, &term, NULL);
    signal(SIGPIPE, SIG_IGN);
    while (!stopping) {
        int client = accept(listener, NULL, NULL);
        if (client < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        char line[LINE], out[LINE];
        ssize_t got = read(client, line, sizeof line - 1);
        int quit = 0;
        if (got > 0) {
            line[got] = '\0';
            quit = handle(line, out, sizeof out);
            if (out[0] && write(client, out, strlen(out)) < 0)
                say("answer lost: %s", strerror(errno));
        }
        if (quit) { /* gone before the client hears back: quit is done when it returns */
            close(listener);
            cleanup();
            close(client);
            return 0;
        }
        close(client);
    }
    close(listener);
    cleanup();
    return 0;
}

static int start_daemon(void) {
    mkdir(pipe_dir, 0755);
    mkdir(log_dir, 0755);
    read_devices();
    int listener = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path);
    if (connect(listener, (struct sockaddr *)&addr, sizeof addr) == 0) {
        fprintf(stderr, "An instance of this daemon is already running\n");
        return 1;
    }
    close(listener);
    unlink(socket_path);
    listener = socket(AF_UNIX, SOCK_STREAM, 0);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) < 0 ||
        listen(listener, 16) < 0) {
        fprintf(stderr, "SIMULATED MPS: cannot listen on %s: %s\n", socket_path, strerror(errno));
        return 1;
    }
    /* Clients are other containers' processes, of any user (a workload image's nonroot one). */
    chmod(socket_path, 0666);
    pid_t child = fork();
    if (child < 0)
        return 1;
    if (child > 0)
        return 0; /* it listens already: a client may connect as soon as this returns */
    setsid();
    if (write_pid() != 0)
        say("cannot write the pid file: %s", strerror(errno));
    say("control daemon started (%d devices: %s)", device_count,
        getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "all");
    save_state();
    int null = open("/dev/null", 2);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
    }
    _exit(serve(listener));
}

static int client(void) {
    char line[LINE];
    while (fgets(line, sizeof line, stdin)) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path);
        if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
            fprintf(stderr, "Cannot find MPS control daemon process\n");
            return 1;
        }
        if (write(fd, line, strlen(line)) < 0) {
            close(fd);
            return 1;
        }
        shutdown(fd, SHUT_WR);
        char answer[LINE];
        ssize_t got;
        while ((got = read(fd, answer, sizeof answer)) > 0)
            fwrite(answer, 1, (size_t)got, stdout);
        close(fd);
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *name = strrchr(argv[0], '/');
    name = name ? name + 1 : argv[0];
    if (strcmp(name, "nvidia-cuda-mps-server") == 0) {
        fprintf(stderr, "SIMULATED nvidia-cuda-mps-server: the stand-in control daemon starts "
                        "no servers\n");
        return 1;
    }
    dirs();
    if (argc == 2 && strcmp(argv[1], "-d") == 0)
        return start_daemon();
    if (argc == 1)
        return client();
    fprintf(stderr, "usage: %s [-d]\n", name);
    return 2;
}
