"""The ddp lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_ddp*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "after_backward": Mistake(
        why="launches every allreduce after backward, in finish_gradient_synchronization",
        edits=(
            ("        self.launched = 0  # buckets 0 .. launched-1 are in flight\n",
             ""),
            ("        self.ready[self.bucket_of[p]] += 1\n"
             "        while self.launched < len(self.buckets) and self.ready[self.launched] == len(self.buckets[self.launched]):\n"
             "            self._launch_next()  # the next bucket in order is full: launch it (and any full ones after it)\n",
             "        index = self.bucket_of[p]\n"
             "        self.ready[index] += 1\n"),
            ("    def _launch_next(self) -> None:\n"
             "        bucket = self.buckets[self.launched]\n"
             "        self.launched += 1\n",
             "    def _launch(self, index: int) -> None:\n"
             "        bucket = self.buckets[index]\n"),
            ("        while self.launched < len(self.buckets):  # some parameter got no gradient this step\n"
             "            self._launch_next()\n",
             "        for index in range(len(self.buckets)):  # backward is over: only now send every bucket\n"
             "            self._launch(index)\n"),
            ("        self.in_flight, self.ready, self.launched = [], [0] * len(self.buckets), 0\n",
             "        self.in_flight, self.ready = [], [0] * len(self.buckets)\n"),
        ),
    ),
    "no_broadcast": Mistake(
        why="forgets the initial broadcast from rank 0",
        edits=(
            ("        for p in module.parameters():\n"
             "            dist.broadcast(p.data, src=0)\n",
             ""),
        ),
    ),
    "no_copy_back": Mistake(
        why="the buckets are allreduced and averaged, but never copied back into .grad",
        edits=(
            ("        for work, flat, bucket in self.in_flight:\n",
             "        for work, flat, _bucket in self.in_flight:\n"),
            ("            offset = 0\n"
             "            for p in bucket:\n"
             "                p.grad = flat[offset:offset + p.numel()].view_as(p).clone()\n"
             "                offset += p.numel()\n",
             ""),
        ),
    ),
    "no_wait": Mistake(
        why="finish_gradient_synchronization reads each bucket without waiting for its allreduce",
        edits=(
            ("        for work, flat, bucket in self.in_flight:\n"
             "            work.wait()\n",
             "        for _work, flat, bucket in self.in_flight:\n"),
        ),
    ),
    "out_of_order": Mistake(
        why="each bucket is launched as soon as it is full, even before an earlier bucket is",
        edits=(
            ("        self.launched = 0  # buckets 0 .. launched-1 are in flight\n",
             ""),
            ("        self.ready[self.bucket_of[p]] += 1\n"
             "        while self.launched < len(self.buckets) and self.ready[self.launched] == len(self.buckets[self.launched]):\n"
             "            self._launch_next()  # the next bucket in order is full: launch it (and any full ones after it)\n",
             "        index = self.bucket_of[p]\n"
             "        self.ready[index] += 1\n"
             "        if self.ready[index] == len(self.buckets[index]):\n"
             "            self._launch(index)\n"),
            ("    def _launch_next(self) -> None:\n"
             "        bucket = self.buckets[self.launched]\n"
             "        self.launched += 1\n",
             "    def _launch(self, index: int) -> None:\n"
             "        bucket = self.buckets[index]\n"),
            ("        while self.launched < len(self.buckets):  # some parameter got no gradient this step\n"
             "            self._launch_next()\n",
             "        for index, count in enumerate(self.ready):\n"
             "            if count < len(self.buckets[index]):  # some parameter got no gradient this step\n"
             "                self._launch(index)\n"),
            ("        self.in_flight, self.ready, self.launched = [], [0] * len(self.buckets), 0\n",
             "        self.in_flight, self.ready = [], [0] * len(self.buckets)\n"),
        ),
    ),
    "reads_before_wait": Mistake(
        why="each bucket is divided and copied back into .grad before its allreduce is waited for",
        edits=(
            ("            work.wait()\n",
             ""),
            ("                offset += p.numel()\n",
             "                offset += p.numel()\n"
             "            work.wait()  # too late: .grad was copied from the bucket before its result landed\n"),
        ),
    ),
    "sums": Mistake(
        why="sums the gradients without averaging them",
        edits=(
            ("            flat /= dist.get_world_size()\n",
             ""),
        ),
    ),
    "waits_in_hook": Mistake(
        why="waits for each allreduce inside the hook: nothing overlaps",
        edits=(
            ("        self.in_flight.append((dist.all_reduce(flat, async_op=True), flat, bucket))\n",
             "        work = dist.all_reduce(flat, async_op=True)\n"
             "        work.wait()\n"
             "        self.in_flight.append((work, flat, bucket))\n"),
        ),
    ),
    "divides_by_four": Mistake(
        why="averages by a hard-coded 4, the published world size, not dist.get_world_size()",
        edits=(
            ("            flat /= dist.get_world_size()\n",
             "            flat /= 4  # the course's 4 GPUs\n"),
        ),
    ),
}
