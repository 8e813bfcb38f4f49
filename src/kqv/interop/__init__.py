"""Weight conversion between Hugging Face `transformers` models and kqv, both ways, offline.

`from_hf` turns a Hugging Face model into the kqv model with the same outputs and `to_hf` turns it back:

    GPT2LMHeadModel               <->  kqv.DecoderLM       pre-LN decoder, learned positions
    BertModel                     <->  kqv.Encoder         post-LN encoder, learned positions, embedding norm
    BertForMaskedLM               <->  kqv.MaskedLM        the same encoder with BERT's prediction head
    MarianMTModel                 <->  kqv.EncoderDecoder  post-LN, sinusoidal positions, scaled embeddings
    BartForConditionalGeneration  <->  kqv.EncoderDecoder  post-LN, learned positions, embedding norms
    GPTNeoXForCausalLM            <->  kqv.DecoderLM       pre-LN decoder, RoPE, LayerNorm, GELU
    LlamaForCausalLM              <->  kqv.DecoderLM       pre-LN decoder, RoPE, RMSNorm, SwiGLU, grouped queries
    MistralForCausalLM             ->  kqv.DecoderLM       a Llama (written back as one)
    Qwen2ForCausalLM               ->  kqv.DecoderLM       a Llama with query, key and value biases (written as one)

That is how kqv proves its blocks are the architectures of the lecture and not lookalikes. `from_hf` reads a model
object or a local directory holding `config.json` and `model.safetensors` (never a pickled `pytorch_model.bin`:
unpickling can run arbitrary code). Nothing is downloaded.

`to_hf` of a kqv model writes the first class that holds its options; when none does, the refusal names the nearest
class's options to change. Each architecture is one `Architecture` entry in `ARCHITECTURES`: a config translation
each way and a list of weight `Rule`s, each turning some checkpoint tensors into some kqv tensors and back. Every
checkpoint tensor is handed out once, so a weight kqv has no place for is an error, not silently dropped. What kqv
does not compute with (BERT's pooler and second token type, the two unused rows of BART's position tables) is kept
beside the converted model in `model.hf_origin`, with the Hugging Face config, so `to_hf(from_hf(m))` gives back
`m`'s state dict exactly.

A sentence-transformers directory (all-MiniLM-L6-v2 by default) becomes a sentence encoder, `kqv.Encoder` with its
tokenizer, mean pooling and L2 normalisation: `SentenceEncoder` (`minilm_directory`: the installed MiniLM).

`transformers` is imported inside functions only: it is an optional dependency, not one of kqv's.
"""

from .architectures import ARCHITECTURES
from .convert import config_from_hf, from_hf, read_hf_directory, to_hf
from .rules import Architecture, HFOrigin, Rule
from .sentence_encoder import SentenceEncoder, minilm_directory

__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "HFOrigin",
    "Rule",
    "SentenceEncoder",
    "config_from_hf",
    "from_hf",
    "minilm_directory",
    "read_hf_directory",
    "to_hf",
]
