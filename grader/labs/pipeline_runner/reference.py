"""Lab: the pipeline runner's forward and backward steps (notebook 08). Check: course.labs.check("pipeline_runner")."""

import torch
import torch.distributed as dist

STUDENT_ID = "solution"  # your student id (the one you log in with): the check draws your own variant from it


def run_stage(stage, ops, micro_inputs, loss_fn, activation_shape):
    """Run this rank's stage through one training step, in the order `ops`; the gradients accumulate in `stage`.

    stage: rank r's part of the model (stage r of p = world size). stage.first and stage.last say where it sits.
        Stage 0 maps token ids (b, S) to activations (b, S, d); the others map activations to activations.
    ops: this stage's order, e.g. [("F", 0), ("F", 1), ("B", 0), ...]: a forward or backward of micro-batch i.
    micro_inputs: the micro-batches' token ids, (b, S) each: stage 0 feeds micro_inputs[i] to its forward.
    loss_fn(out, i): on the last stage, the loss of micro-batch i (already divided by the number of micro-batches).
    activation_shape: (b, S, d), the shape of what stages send each other (activations and their gradients):
        receive into torch.empty(activation_shape, device=micro_inputs[0].device).

    Forward i: receive x from rank - 1 (not on stage 0; dist.irecv then wait), out = stage(x), keep what backward
    needs, then send out.detach() to rank + 1 (dist.isend; the last stage computes loss_fn(out, i) instead).
    Backward i: receive the gradient of out from rank + 1 (the last stage backpropagates its loss), backward,
    then send the gradient of x to rank - 1 (not from stage 0). A received x must require grad for that.
    Wait for every request: each irecv before its tensor is read, each isend before returning.
    """
    rank, sends, held = dist.get_rank(), [], {}
    for kind, i in ops:
        if kind == "F":
            if stage.first:
                x = micro_inputs[i]
            else:
                x = torch.empty(activation_shape, device=micro_inputs[0].device)
                dist.irecv(x, rank - 1).wait()
                x.requires_grad_()
            out = stage(x)
            if stage.last:
                out = loss_fn(out, i)
            else:
                sends.append(dist.isend(out.detach().contiguous(), rank + 1))
            held[i] = (x, out)  # backward of i needs both
        else:
            x, out = held.pop(i)
            if stage.last:
                out.backward()
            else:
                grad = torch.empty(activation_shape, device=micro_inputs[0].device)
                dist.irecv(grad, rank + 1).wait()
                out.backward(grad)
            if not stage.first:
                sends.append(dist.isend(x.grad.contiguous(), rank - 1))
    for request in sends:
        request.wait()

