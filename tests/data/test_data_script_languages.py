"""qkv.data.languages.script_language: a language named by its script alone (the fallback that
needs no package), checked on real sentences against py3langid, the identifier it stands in
for, and on texts whose script says nothing."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from qkv.data import languages as L

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_data_languages import SENTENCES

#: everyday sentences in languages whose script names them (or whose letters do)
SCRIPTED = {
    "zh": SENTENCES["zh"],
    "ja": ["猫が椅子の上で寝ています。", "閉じる前に文書を保存してください。", "駅はどこですか？",
           "コーヒーを一杯お願いします。", "会議は木曜日の午後に変更されました。"],
    "ko": ["고양이가 의자 위에서 자고 있어요.", "문서를 닫기 전에 저장하세요.", "기차역이 어디예요?",
           "커피 한 잔 주세요.", "회의가 목요일 오후로 옮겨졌습니다."],
    "ru": ["Кошка спит на стуле.", "Сохраните документ перед закрытием.", "Где находится вокзал?",
           "Я хотел бы чашку кофе, пожалуйста.", "Встреча перенесена на четверг."],
    "uk": ["Кіт спить на стільці.", "Збережіть документ перед тим, як його закрити.",
           "Де знаходиться вокзал?", "Я хотів би чашку кави, будь ласка.",
           "Зустріч перенесли на четвер після обіду."],
    "el": ["Η γάτα κοιμάται στην καρέκλα.", "Αποθηκεύστε το έγγραφο πριν το κλείσετε.",
           "Πού είναι ο σιδηροδρομικός σταθμός;", "Θα ήθελα ένα φλιτζάνι καφέ, παρακαλώ."],
    "he": ["החתול ישן על הכיסא.", "שמור את המסמך לפני הסגירה.", "איפה תחנת הרכבת?",
           "אני רוצה כוס קפה, בבקשה."],
    "th": ["แมวกำลังนอนอยู่บนเก้าอี้", "กรุณาบันทึกเอกสารก่อนปิด", "สถานีรถไฟอยู่ที่ไหน",
           "ขอกาแฟหนึ่งแก้วครับ"],
    "ar": ["القطة نائمة على الكرسي.", "احفظ المستند قبل إغلاقه.", "أين محطة القطار؟",
           "أريد فنجان قهوة من فضلك."],
    "fa": ["گربه روی صندلی خوابیده است.", "پیش از بستن سند آن را ذخیره کنید.",
           "ایستگاه قطار کجاست؟", "یک فنجان قهوه می‌خواهم، لطفاً."],
    "hi": ["बिल्ली कुर्सी पर सो रही है।", "बंद करने से पहले दस्तावेज़ सहेजें।", "रेलवे स्टेशन कहाँ है?",
           "मुझे एक कप कॉफ़ी चाहिए।"],
}  # fmt: skip


@pytest.mark.parametrize("code", sorted(SCRIPTED))
def test_a_sample_in_one_script_is_named_as_py3langid_names_it(code):
    texts = SCRIPTED[code]
    found, share = L.script_language(texts)
    assert found == code and 0.5 < share <= 1.0
    # shuffled, the same; one sentence alone too where the script is the language's own (a
    # shared script's distinct letters need more than one short sentence to appear)
    rng = random.Random(code)
    assert L.script_language(rng.sample(texts, len(texts)))[0] == code
    if code not in ("uk", "fa", "ar", "ru"):
        assert L.script_language(rng.choice(texts))[0] == code
    try:
        import py3langid  # noqa: F401
    except ImportError:
        return
    assert L.detect_language(texts)[0] == found  # the identifier agrees


def test_latin_script_mixed_scripts_and_no_letters_say_nothing():
    for code in ("en", "fr", "de"):
        assert L.script_language(SENTENCES[code]) == ("", 0.0)
    assert L.script_language(["12 + 7 = 19", "...", ""]) == ("", 0.0)
    assert L.script_language([]) == ("", 0.0)
    # half Latin, half Greek: no script holds over half of the letters
    assert L.script_language(["abcd", "αβγδ"]) == ("", 0.0)
    # Chinese with a few Latin names is still Chinese; kana makes it Japanese
    assert L.script_language(["我在 Google 工作。", "他住在北京。"])[0] == "zh"
    assert L.script_language(["私は Google で働いています。"])[0] == "ja"


def test_random_han_text_is_chinese_and_random_hangul_korean():
    rng = random.Random(7)
    han = ["".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(20)) for _ in range(30)]
    hangul = ["".join(chr(rng.randrange(0xAC00, 0xD7A3)) for _ in range(20)) for _ in range(30)]
    assert L.script_language(han)[0] == "zh"
    assert L.script_language(hangul)[0] == "ko"
    kana = "".join(chr(rng.randrange(0x3041, 0x3096)) for _ in range(3))
    assert L.script_language([s[:17] + kana for s in han])[0] == "ja"
