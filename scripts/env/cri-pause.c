/* The pause program of the CRI test nodes' sandbox image (scripts/env/cri-node.sh): what a pod's infra
 * container runs -- it holds the pod's namespaces, reaps the children a shared PID namespace hands it, and
 * exits on SIGINT or SIGTERM. Built static, so the image is this one file. (The registry's pause image
 * cannot be pulled here: no registry is reachable.) */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int sig)
{
    (void)sig;
    _exit(0);
}

static void reap(int sig)
{
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void)
{
    struct sigaction stop, child;

    if (getpid() != 1) {
        static const char warning[] = "pause: not PID 1 of its namespace\n";
        (void)!write(2, warning, sizeof(warning) - 1);
    }
    memset(&stop, 0, sizeof(stop));
    stop.sa_handler = leave;
    sigaction(SIGINT, &stop, NULL);
    sigaction(SIGTERM, &stop, NULL);
    memset(&child, 0, sizeof(child));
    child.sa_handler = reap;
    child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &child, NULL);
    for (;;)
        pause();
    return 0;
}
