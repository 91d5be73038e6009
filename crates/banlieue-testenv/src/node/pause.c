/* The sandbox ("pause") process of the test node's pods: holds the pod's namespaces and does
 * nothing else. Built static (gcc -static) so its image needs no libc. It ends on SIGINT or
 * SIGTERM and reaps orphans, as PID 1 of a pod must. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction action = {0};
    action.sa_handler = stop;
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    action.sa_handler = reap;
    action.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &action, NULL);
    for (;;) {
        pause();
    }
}
