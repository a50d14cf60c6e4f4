#include <Python.h> /* first: feature macros; the stop call releases the GIL while joining */
#include "_common.h"
#include "watcher.h"
#include "doorbell.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct fulmar_watcher_stct
{
    int epoll_fd;
    int stop_fd; /* an eventfd that ends the thread */
    char *doorbell_base;
    int64_t doorbell_offset;
    pthread_t thread;
};

static void *watch(void *arg)
{
    fulmar_watcher_t *watcher = (fulmar_watcher_t *)arg;
    struct epoll_event events[16];
    for (;;)
    {
        int count = epoll_wait(watcher->epoll_fd, events, 16, -1);
        if (count < 0)
        {
            if (EINTR == errno)
            {
                continue;
            }
            break;
        }
        int ring = 0;
        for (int i = 0; i < count; i++)
        {
            if (events[i].data.fd == watcher->stop_fd)
            {
                return NULL;
            }
            ring = 1;
        }
        if (ring)
        {
            fulmar_doorbell_ring(watcher->doorbell_base, watcher->doorbell_offset);
        }
    }
    return NULL;
}

fulmar_watcher_t *fulmar_watcher_start(char *doorbell_base, int64_t doorbell_offset)
{
    fulmar_watcher_t *watcher = calloc(1, sizeof(*watcher));
    if (NULL == watcher)
    {
        return NULL;
    }
    watcher->doorbell_base = doorbell_base;
    watcher->doorbell_offset = doorbell_offset;
    watcher->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    watcher->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (watcher->epoll_fd < 0 || watcher->stop_fd < 0)
    {
        goto fail;
    }
    struct epoll_event stop_event = {.events = EPOLLIN, .data.fd = watcher->stop_fd};
    if (epoll_ctl(watcher->epoll_fd, EPOLL_CTL_ADD, watcher->stop_fd, &stop_event) < 0)
    {
        goto fail;
    }
    if (pthread_create(&watcher->thread, NULL, watch, watcher) != 0)
    {
        goto fail;
    }
    return watcher;

fail:
    if (watcher->epoll_fd >= 0)
    {
        close(watcher->epoll_fd);
    }
    if (watcher->stop_fd >= 0)
    {
        close(watcher->stop_fd);
    }
    free(watcher);
    return NULL;
}

int32_t fulmar_watcher_add(fulmar_watcher_t *watcher, int32_t fd)
{
    struct epoll_event event = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = fd};
    return epoll_ctl(watcher->epoll_fd, EPOLL_CTL_ADD, fd, &event) < 0 ? -errno : 0;
}

int32_t fulmar_watcher_remove(fulmar_watcher_t *watcher, int32_t fd)
{
    return epoll_ctl(watcher->epoll_fd, EPOLL_CTL_DEL, fd, NULL) < 0 ? -errno : 0;
}

int32_t fulmar_watcher_rearm(fulmar_watcher_t *watcher, int32_t fd)
{
    struct epoll_event event = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = fd};
    return epoll_ctl(watcher->epoll_fd, EPOLL_CTL_MOD, fd, &event) < 0 ? -errno : 0;
}

void fulmar_watcher_stop(fulmar_watcher_t *watcher)
{
    uint64_t one = 1;
    ssize_t written = write(watcher->stop_fd, &one, sizeof(one));
    (void)written;
    Py_BEGIN_ALLOW_THREADS
    pthread_join(watcher->thread, NULL);
    Py_END_ALLOW_THREADS
    close(watcher->epoll_fd);
    close(watcher->stop_fd);
    free(watcher);
}
