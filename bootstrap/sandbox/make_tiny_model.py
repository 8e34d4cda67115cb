"""Make a tiny, deterministic Llama model for the sandbox's vLLM image.

Runs INSIDE the vLLM CPU image at build time (it needs torch, transformers and tokenizers, which
vLLM brings); nothing is downloaded. The weights are random (seeded), so the model talks nonsense,
but vLLM loads and serves it like any Llama checkpoint:

    python make_tiny_model.py [OUTPUT_DIR]        # default /opt/models/tiny-llama

Shape: hidden 256, 4 heads (head_dim 64: the CPU attention kernel rejects smaller head sizes),
4 layers, a 512-token byte-level BPE tokenizer trained on the text below.
"""
from __future__ import annotations

import sys
from pathlib import Path

DEFAULT_OUTPUT = "/opt/models/tiny-llama"
SEED = 1234
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]

# Training text for the tokenizer: written for this file so the result never depends on a download
# or on the Python version.
CORPUS = """
A cluster is a set of machines that work together as one. Each machine runs a container with the
same image, and one of them is the head. The head starts first; the workers join it by address.
When every node has joined, the scheduler knows how many processors and how much memory there are.
The model server then loads the weights, splits the layers across the devices, and answers requests.

Bootstrapping a cluster over SSH is simple in principle: connect to every host, check that Docker
runs, pull the image, start the head, start the workers, and wait until the head reports all of
them. In practice each step can fail: a host is unreachable, a key was changed, a disk is full,
the network interface has another name, the clock is wrong, or the image does not contain the
command that the next step needs. A good tool checks everything before it changes anything, and
tells the operator which host failed, what command ran, and what it printed.

The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly
quick daft zebras jump. Sphinx of black quartz, judge my vow. The five boxing wizards jump quickly.

Numbers: zero one two three four five six seven eight nine ten eleven twelve twenty thirty forty
fifty sixty seventy eighty ninety hundred thousand million. 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024.
Days: Monday Tuesday Wednesday Thursday Friday Saturday Sunday. Months: January February March
April May June July August September October November December. Colours: red orange yellow green
blue indigo violet black white grey brown pink purple.

Once upon a time there was a small model that lived in a container. It knew only five hundred and
twelve tokens, four layers and four heads, yet it answered every question it was asked, quickly
and with great confidence, though never correctly. The engineers loved it all the same, because it
loaded in a second, fitted in a few megabytes, and proved that the whole path from the request to
the response worked: the sockets, the scheduler, the tokenizer, the cache, the sampler, the stream.

def serve(model, port=8000):
    server = Server(model=model, host="0.0.0.0", port=port)
    for request in server.requests():
        tokens = tokenizer.encode(request.prompt)
        output = model.generate(tokens, max_tokens=request.max_tokens, temperature=0.0)
        request.reply({"text": tokenizer.decode(output)})

{"model": "tiny-llama", "prompt": "Hello, my name is", "max_tokens": 16, "temperature": 0}
ray start --head --port=6379 ; vllm serve /opt/models/tiny-llama --max-model-len 256
"""

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the corpus so pair counts are well separated; training is deterministic.
    lines = [ln for ln in CORPUS.splitlines() if ln.strip()] * 4
    tok.train_from_iterator(lines, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=1024,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16).eval()


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else DEFAULT_OUTPUT)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny-llama: {n_params} parameters, vocab {VOCAB_SIZE}, saved to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
