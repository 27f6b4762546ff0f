/* test_sched.c - gang placement as a pure function: all ranks or nothing, distinct workers of the
 * right slot type, best fit (fewest free slots that still fit), deterministic ties, and the
 * "can this ever fit" check against total slots. */
#include <criterion/criterion.h>

#include "service/service.h"

#define W(id_, type_, total_, free_) {.id = id_, .slot_type = type_, .slots = total_, .slots_free = free_}

Test(sched, gang_needs_distinct_workers)
{
    sched_worker_t w[] = {W("a", "cpu", 8, 8), W("b", "cpu", 1, 1)};
    sched_placement_t p;
    /* Two nodes of 2 slots: only "a" has 2 free; one worker cannot be two nodes. */
    sched_request_t r = {.nodes = 2, .slots_per_node = 2, .slot_type = "cpu"};
    cr_assert_not(sched_place(w, 2, &r, &p));
    cr_assert_eq(p.nodes, 0, "never a partial placement");
    r.slots_per_node = 1;
    cr_assert(sched_place(w, 2, &r, &p));
    cr_assert_eq(p.nodes, 2);
    cr_assert_neq(p.worker[0], p.worker[1]);
}

Test(sched, best_fit_packs)
{
    /* Free slots 4, 1, 2, 8: a 1-slot job goes to the 1-free worker, a 2-slot one to the 2-free
     * worker, keeping the big holes for big jobs. */
    sched_worker_t w[] = {W("a", "cpu", 4, 4), W("b", "cpu", 4, 1), W("c", "cpu", 4, 2), W("d", "cpu", 8, 8)};
    sched_placement_t p;
    sched_request_t r1 = {.nodes = 1, .slots_per_node = 1, .slot_type = "cpu"};
    cr_assert(sched_place(w, 4, &r1, &p));
    cr_assert_eq(p.worker[0], 1);
    sched_request_t r2 = {.nodes = 1, .slots_per_node = 2, .slot_type = "cpu"};
    cr_assert(sched_place(w, 4, &r2, &p));
    cr_assert_eq(p.worker[0], 2);
    sched_request_t r3 = {.nodes = 2, .slots_per_node = 3, .slot_type = "cpu"};
    cr_assert(sched_place(w, 4, &r3, &p));
    cr_assert_eq(p.nodes, 2);
    cr_assert_eq(p.worker[0], 0);
    cr_assert_eq(p.worker[1], 3);
    sched_request_t r4 = {.nodes = 1, .slots_per_node = 5, .slot_type = "cpu"};
    cr_assert(sched_place(w, 4, &r4, &p));
    cr_assert_eq(p.worker[0], 3);
}

Test(sched, ties_go_to_lower_index)
{
    sched_worker_t w[] = {W("a", "cpu", 2, 2), W("b", "cpu", 2, 2), W("c", "cpu", 2, 2)};
    sched_placement_t p;
    sched_request_t r = {.nodes = 2, .slots_per_node = 2, .slot_type = "cpu"};
    cr_assert(sched_place(w, 3, &r, &p));
    cr_assert_eq(p.worker[0], 0);
    cr_assert_eq(p.worker[1], 1);
}

Test(sched, slot_type_must_match)
{
    sched_worker_t w[] = {W("g", "gpu", 8, 8), W("c", "cpu", 1, 1)};
    sched_placement_t p;
    sched_request_t r = {.nodes = 1, .slots_per_node = 2, .slot_type = "cpu"};
    cr_assert_not(sched_place(w, 2, &r, &p));
    cr_assert_not(sched_fits(w, 2, &r));
    r.slot_type = "gpu";
    cr_assert(sched_place(w, 2, &r, &p));
    cr_assert_eq(p.worker[0], 0);
}

Test(sched, fits_uses_total_slots)
{
    /* Busy now, but it would fit an idle cluster: the job waits instead of being rejected. */
    sched_worker_t w[] = {W("a", "cpu", 2, 0), W("b", "cpu", 2, 1)};
    sched_placement_t p;
    sched_request_t r = {.nodes = 2, .slots_per_node = 2, .slot_type = "cpu"};
    cr_assert_not(sched_place(w, 2, &r, &p));
    cr_assert(sched_fits(w, 2, &r));
    sched_request_t big = {.nodes = 3, .slots_per_node = 1, .slot_type = "cpu"};
    cr_assert_not(sched_fits(w, 2, &big), "more nodes than workers never fits");
    sched_request_t wide = {.nodes = 1, .slots_per_node = 3, .slot_type = "cpu"};
    cr_assert_not(sched_fits(w, 2, &wide), "more slots per node than any worker has never fits");
}

Test(sched, bad_requests_and_empty_cluster)
{
    sched_worker_t w[] = {W("a", "cpu", 2, 2)};
    sched_placement_t p;
    sched_request_t zero = {.nodes = 0, .slots_per_node = 1, .slot_type = "cpu"};
    cr_assert_not(sched_place(w, 1, &zero, &p));
    sched_request_t r = {.nodes = 1, .slots_per_node = 1, .slot_type = "cpu"};
    cr_assert_not(sched_place(w, 0, &r, &p));
    cr_assert_not(sched_fits(NULL, 0, &r));
    sched_request_t huge = {.nodes = SCHED_MAX_NODES + 1, .slots_per_node = 1, .slot_type = "cpu"};
    cr_assert_not(sched_place(w, 1, &huge, &p));
}

Test(sched, many_workers_exact_gang)
{
    enum { N = 64 };
    sched_worker_t w[N];
    char ids[N][16];
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof(ids[i]), "w%d", i);
        w[i] = (sched_worker_t)W(ids[i], "cpu", 4, i % 5);  /* free 0..4 */
    }
    sched_placement_t p;
    sched_request_t r = {.nodes = 12, .slots_per_node = 3, .slot_type = "cpu"};
    cr_assert(sched_place(w, N, &r, &p));
    cr_assert_eq(p.nodes, 12);
    int threes = 0;
    for (int k = 0; k < 12; k++) {
        cr_assert_geq(w[p.worker[k]].slots_free, 3);
        threes += w[p.worker[k]].slots_free == 3;
        for (int j = 0; j < k; j++)
            cr_assert_neq(p.worker[j], p.worker[k]);
    }
    cr_assert_eq(threes, 12, "the 13 workers with exactly 3 free are preferred over those with 4");
    sched_request_t r2 = {.nodes = 27, .slots_per_node = 3, .slot_type = "cpu"};
    cr_assert_not(sched_place(w, N, &r2, &p), "only 26 workers have 3 or more free");
}
