"""`model.training.input_gradient`: a backward that computes an input's gradient (an attack's
`loss_gradient`), not a training step, so native AMP needs no loss scaling for it (AMP102 and the
apex migration ask it). The shapes are adversarial-robustness-toolbox's estimators."""

from ampfix.model.readwrite import dotted_reads, mutations, overlaps
from conftest import call_named, model

ESTIMATOR = """
    import numpy as np
    import torch
    from apex import amp

    class Estimator:
        def fit(self, x, y):
            for x_batch, y_batch in zip(x, y):
                self._optimizer.zero_grad()
                loss = self._loss(self._model(x_batch), y_batch)
                with amp.scale_loss(loss, self._optimizer) as scaled_loss:
                    scaled_loss.backward()
                self._optimizer.step()

        def loss_gradient(self, x, y):
            if isinstance(x, torch.Tensor):
                x_grad = x.clone().detach().requires_grad_(True)
            else:
                x_grad = torch.tensor(x).to(self._device)
                x_grad.requires_grad = True
            loss = self._loss(self._model(x_grad), y)
            self._model.zero_grad()
            with amp.scale_loss(loss, self._optimizer) as scaled_loss:
                scaled_loss.backward()
            return x_grad.grad.cpu().numpy().copy()
    """


def scale_losses(m):
    return [c for c in m.calls if m.code(c.func) == "amp.scale_loss"]


def test_an_input_gradient_and_a_training_step():
    m = model(ESTIMATOR)
    fit, grad = scale_losses(m)
    assert m.training.input_gradient(fit) is None  # the optimizer steps
    assert m.training.input_gradient(grad) == "x_grad"
    assert m.training.input_gradient(call_named(m, "scaled_loss.backward()")) is None  # fit's


def test_items_made_to_require_grad_by_a_helper():
    """pytorch_deep_speech.py: `x_in[i].grad` of a numpy array of tensors whose items a helper of
    the file (`_transform(x=x_in)`) makes require gradients."""
    m = model("""
        import numpy as np

        class Speech:
            def loss_gradient(self, x, y):
                x_in = np.empty(len(x), dtype=object)
                x_in[:] = list(x)
                inputs = self._transform(x=x_in, compute_gradient=True)
                loss = self.criterion(self._model(inputs), y)
                loss.backward()
                return np.array([x_in[i].grad.cpu().numpy() for i, _ in enumerate(x_in)])

            def _transform(self, x, compute_gradient=False):
                for i, _ in enumerate(x):
                    if compute_gradient:
                        x[i].requires_grad = True
                return x
        """)
    assert m.training.input_gradient(call_named(m, "loss.backward()")) == "x_in[i]"


def test_not_an_input_gradient():
    m = model("""
        import torch

        def grad_norms(model, loss):
            loss.backward()  # parameters' gradients, stepped elsewhere
            return [p.grad.norm() for p in model.parameters()]

        def of_a_parameter(model, loss):
            w = model.weight
            w.requires_grad = True
            loss.backward()
            return w.grad

        def of_an_argument(x, loss):
            x.requires_grad = True
            loss.backward()
            return x.grad

        def never_required(model, x):
            x_grad = torch.tensor(x)
            model(x_grad).sum().backward()
            return x_grad.grad

        def steps(model, opt, x):
            x_grad = torch.tensor(x, requires_grad=True)
            model(x_grad).sum().backward()
            opt.step()
            return x_grad.grad

        def attack(model, x):
            x_adv = torch.tensor(x, requires_grad=True)
            model(x_adv).sum().backward()
            return x_adv.grad

        def train(model, opt, x):
            grad = attack(model, x)  # its caller steps after it: the parameters' gradients are used
            opt.step()
        """)
    for text in ("loss.backward()", "model(x_grad).sum().backward()", "model(x_adv).sum().backward()"):
        for call in [c for c in m.calls if m.code(c) == text]:
            assert m.training.input_gradient(call) is None, (m.line(call), text)


def test_requires_grad_set_by_a_factory_or_in_place():
    m = model("""
        import torch

        def saliency(model, x):
            x_adv = torch.tensor(x, requires_grad=True).to("cuda")
            model(x_adv).sum().backward()
            return x_adv.grad

        def other(model, x):
            delta = torch.zeros_like(x)
            delta.requires_grad_()
            model(x + delta).sum().backward()
            return delta.grad.detach()
        """)
    first, second = [c for c in m.calls if m.code(c).endswith(".sum().backward()")]
    assert m.training.input_gradient(first) == "x_adv"
    assert m.training.input_gradient(second) == "delta"


def test_objects_changed_in_place():
    """What the apex migration's forward region asks: `x.requires_grad = True` changes the `x` that
    `model(x)` reads, so it cannot move after it."""
    stmt = lambda src: model(src).module.body[0]  # noqa: E731
    assert mutations(stmt("x.requires_grad = True")) == {"x.requires_grad"}
    assert mutations(stmt("x[i] = torch.tensor(x[i])")) == {"x"}
    assert mutations(stmt("x.requires_grad_()")) == {"x"}
    assert mutations(stmt("self._optimizer.zero_grad()")) == set()
    assert dotted_reads(stmt("diff = self._model(x_grad) - y")) == {"diff", "self._model", "x_grad", "y"}
    assert overlaps({"x.requires_grad"}, {"x"}) and not overlaps({"self.step"}, {"self._model"})
